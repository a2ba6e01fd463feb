/* The SVG figure of nsa bench (plot_svg.h). */
#include "plot_svg.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define W 1000
#define H 440
#define PW 380 /* panel width and height */
#define PH 300
#define PX0 80 /* left panel's origin (top left of its plot area) */
#define PX1 580
#define PY 60

static const char *const colors[] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2"};
#define NCOLORS ((int)(sizeof colors / sizeof colors[0]))

/* XML-escaped text */
static void put_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if ((unsigned char)*s >= 0x20) fputc(*s, f);
        }
    }
}

typedef struct axis {
    double lo, hi; /* log10 of the range */
} axis;

static double axpos(const axis *a, double v, double len) { return (log10(v) - a->lo) / (a->hi - a->lo) * len; }

/* a log axis over [vmin, vmax], widened to whole powers of ten (or of two for T) */
static axis log_axis(double vmin, double vmax, double base)
{
    axis a;
    double lb = log10(base);
    a.lo = floor(log10(vmin) / lb) * lb;
    a.hi = ceil(log10(vmax) / lb) * lb;
    if (a.hi - a.lo < lb) a.hi = a.lo + lb;
    return a;
}

static void fmt_T(char *buf, size_t n, double T)
{
    if (T >= 1024 && fmod(T, 1024) == 0)
        snprintf(buf, n, "%gk", T / 1024);
    else
        snprintf(buf, n, "%g", T);
}

static void frame(FILE *f, int x0, const char *ylabel, const char *title)
{
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n", x0, PY, PW, PH);
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"14\" text-anchor=\"middle\">", x0 + PW / 2, PY - 12);
    put_text(f, title);
    fprintf(f, "</text>\n<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">tokens per sequence (T)</text>\n",
            x0 + PW / 2, PY + PH + 38);
    fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 %d %d)\">", x0 - 52,
            PY + PH / 2, x0 - 52, PY + PH / 2);
    put_text(f, ylabel);
    fputs("</text>\n", f);
}

static void x_ticks(FILE *f, int x0, const axis *ax)
{
    for (double e = ax->lo; e <= ax->hi + 1e-9; e += log10(2.0)) {
        const double T = pow(10, e), x = x0 + axpos(ax, T, PW);
        char lab[32];
        fmt_T(lab, sizeof lab, round(T));
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>\n", x, PY, x, PY + PH);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n", x, PY + PH + 16, lab);
    }
}

int plot_speed_svg(const char *path, const char *title, const plot_series *series, int nseries, char *err,
                   size_t err_size)
{
    double tmin = INFINITY, tmax = 0, mmin = INFINITY, mmax = 0, smax = 0;
    for (int s = 0; s < nseries; s++)
        for (int i = 0; i < series[s].n; i++) {
            const double T = series[s].T[i], ms = series[s].ms[i];
            if (!(T > 0) || !(ms > 0) || !isfinite(ms)) continue;
            tmin = fmin(tmin, T), tmax = fmax(tmax, T), mmin = fmin(mmin, ms), mmax = fmax(mmax, ms);
        }
    if (nseries < 1 || !(tmax > 0)) {
        snprintf(err, err_size, "nothing to plot: no series has a measured time");
        return -1;
    }
    /* speedups of series 0 over the others, at the T both have */
    double sp[8][PLOT_MAX_POINTS];
    const int nsp = nseries - 1 < 8 ? nseries - 1 : 8;
    for (int s = 1; s <= nsp; s++)
        for (int i = 0; i < series[s].n; i++) {
            sp[s - 1][i] = NAN;
            for (int j = 0; j < series[0].n; j++)
                if (series[0].T[j] == series[s].T[i] && series[0].ms[j] > 0 && series[s].ms[i] > 0)
                    sp[s - 1][i] = series[s].ms[i] / series[0].ms[j];
            if (isfinite(sp[s - 1][i])) smax = fmax(smax, sp[s - 1][i]);
        }
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(err, err_size, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    const axis ax = log_axis(tmin, tmax, 2), ay = log_axis(mmin, mmax, 10);
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H, W, H);
    fprintf(f, "<text x=\"%d\" y=\"24\" font-size=\"15\" text-anchor=\"middle\" font-weight=\"bold\">", W / 2);
    put_text(f, title);
    fputs("</text>\n", f);

    /* left: time */
    frame(f, PX0, "time per forward (ms)", "time");
    x_ticks(f, PX0, &ax);
    for (double e = ay.lo; e <= ay.hi + 1e-9; e += 1) {
        const double y = PY + PH - axpos(&ay, pow(10, e), PH);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", PX0, y, PX0 + PW, y);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%g</text>\n", PX0 - 6, y + 4,
                pow(10, e));
    }
    for (int s = 0; s < nseries; s++) {
        const char *col = colors[s % NCOLORS];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col);
        for (int i = 0; i < series[s].n; i++)
            if (series[s].ms[i] > 0 && isfinite(series[s].ms[i]))
                fprintf(f, "%.1f,%.1f ", PX0 + axpos(&ax, series[s].T[i], PW),
                        PY + PH - axpos(&ay, series[s].ms[i], PH));
        fputs("\"/>\n", f);
        for (int i = 0; i < series[s].n; i++)
            if (series[s].ms[i] > 0 && isfinite(series[s].ms[i]))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                        PX0 + axpos(&ax, series[s].T[i], PW), PY + PH - axpos(&ay, series[s].ms[i], PH), col);
        /* legend */
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"3\" fill=\"%s\"/>\n", PX0 + 8, PY + 12 + 16 * s, col);
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"11\">", PX0 + 26, PY + 17 + 16 * s);
        put_text(f, series[s].name);
        fputs("</text>\n", f);
    }

    /* right: speedup of series 0 over each other, linear y from 0 */
    char lab[160];
    snprintf(lab, sizeof lab, "speedup of %.60s", series[0].name);
    frame(f, PX1, "speedup (x)", lab);
    x_ticks(f, PX1, &ax);
    double top = smax > 0 ? smax * 1.15 : 2;
    const double step = top > 20 ? 5 : top > 8 ? 2 : top > 3 ? 1 : 0.5;
    top = ceil(top / step) * step;
    for (double v = 0; v <= top + 1e-9; v += step) {
        const double y = PY + PH - v / top * PH;
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\"/>\n", PX1, y, PX1 + PW, y,
                fabs(v - 1) < 1e-9 ? "#888" : "#ddd");
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%g</text>\n", PX1 - 6, y + 4, v);
    }
    for (int s = 1; s <= nsp; s++) {
        const char *col = colors[s % NCOLORS];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col);
        for (int i = 0; i < series[s].n; i++)
            if (isfinite(sp[s - 1][i]))
                fprintf(f, "%.1f,%.1f ", PX1 + axpos(&ax, series[s].T[i], PW), PY + PH - sp[s - 1][i] / top * PH);
        fputs("\"/>\n", f);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"3\" fill=\"%s\"/>\n", PX1 + 8, PY + 12 + 16 * (s - 1),
                col);
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"11\">over ", PX1 + 26, PY + 17 + 16 * (s - 1));
        put_text(f, series[s].name);
        fputs("</text>\n", f);
    }
    fputs("</svg>\n", f);
    if (fclose(f) != 0) {
        snprintf(err, err_size, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}
