/*
 * The pictures of nsa bench: time and speedup against sequence length, as one
 * self-contained SVG file (no library: plain text a browser or an image tool
 * renders). Left panel: time per forward (ms) against T, both axes log2/log10.
 * Right panel: the speedup of the first series over each other one against T.
 */
#ifndef NSA_TOOLS_PLOT_SVG_H
#define NSA_TOOLS_PLOT_SVG_H

#include <stddef.h>
#include <stdint.h>

#define PLOT_MAX_POINTS 64

typedef struct plot_series {
    char name[96];
    int n;
    double T[PLOT_MAX_POINTS];  /* tokens per sequence */
    double ms[PLOT_MAX_POINTS]; /* time per forward; NaN: not measured */
} plot_series;

/* Writes the figure to path. Series 0 is the library; the speedup panel shows
 * series[i].ms / series[0].ms at the T both measured. Returns 0, or -1 with a
 * message in err. */
int plot_speed_svg(const char *path, const char *title, const plot_series *series, int nseries, char *err,
                   size_t err_size);

#endif
