/*
 * The corpus: a deterministic list of configurations every backend is checked on.
 *
 * Hand-written cases name the corner they cover (their label says which); the
 * rest of the "full" corpus is drawn from a fixed-seed splitmix64 so that the
 * list is the same on every machine. Cases are written in a small spec language
 * so that a line reads like the configuration it is:
 *
 *   T=37,0,64   sequence lengths (a batch; 0 is an empty sequence)
 *   H=4/2       Hq / Hkv              D=17/5   Dqk / Dv
 *   l= d= s=    compression block, stride, selection block (l_s)
 *   n= i= o=    selected blocks, forced initial, forced local
 *   w=          window (0: off)       sc=      scale (0: 1/sqrt(Dqk))
 *   c=          mean | lin | linpe | ext
 *   lay=        dense | strided | distinct      fix  (caller-given indices)
 *   rows=       check about this many tokens per sequence (tk_case_sample):
 *               the oracle computes only their rows (0: every token)
 *
 * Unnamed keys keep these defaults: T=40 H=2/1 D=8/8 l=8 d=4 s=16 n=3 i=1 o=1
 * w=16 c=mean sc=0 lay=dense rows=0.
 *
 * Cost: the long cases (T up to 3001) use one or two heads of dimension <= 5 so
 * that the whole full corpus stays cheap on the cpu backend. The full and small
 * corpora check every row; the gpu corpus, whose model sizes make the fp64
 * oracle of every row too slow, a sample (rows=).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "testkit.h"

typedef struct spec {
    const char *label;
    const char *text;
} spec;

/* ---------------------------------------------------------------- full corpus */
static const spec full_specs[] = {
    /* sequence length: 1 .. thousands, around l, l_s and w */
    {"T1", "T=1"},
    {"T2", "T=2"},
    {"T3<l", "T=3 l=8 d=4"},
    {"T7<l", "T=7 l=8 d=4"},
    {"T8=l", "T=8"},
    {"T9", "T=9"},
    {"T12=l+d", "T=12"},
    {"T16=ls", "T=16"},
    {"T17-nonmul", "T=17"},
    {"T31<w", "T=31 w=64"},
    {"T100<w", "T=100 w=128 n=4"},
    {"T63-nonmul", "T=63 s=32 l=16 d=8 n=2 i=1 o=1"},
    {"T<l-lin", "T=5 l=8 d=4 c=lin"},
    {"T<l-ext", "T=6 l=8 d=4 c=ext"},
    {"T<ls", "T=14 l=4 d=2 s=16 n=2"},
    /* group size G in {1,2,3,4,8,16,20} */
    {"G1", "H=3/3 T=50"},
    {"G2", "H=4/2 T=50"},
    {"G3", "H=6/2 D=5/5 T=50"},
    {"G4", "H=4/1 T=70"},
    {"G8", "H=8/1 D=4/4 T=70"},
    {"G16", "H=16/1 D=4/3 T=70"},
    {"G16-hkv2", "H=32/2 D=3/3 T=60"},
    {"G3-hkv3", "H=9/3 D=5/3 T=45 n=2 o=1 i=0"},
    /* G > 16: kernels that take a group's heads 16 at a time (OpenCL's slc_attn_v3: 16 + 4) */
    {"G20-hkv2", "H=40/2 D=6/5 T=150 n=3"},
    /* G = 16 with Dqk in (128, 192]: CUDA's slc_sm80_g16 at padded Dqk 192, also with l_s < 64 */
    {"G16-D160-ls32", "H=16/1 D=160/96 l=16 d=8 s=32 n=4 i=1 o=2 w=64 T=200"},
    {"G16-D192-ls64", "H=16/1 D=192/128 l=32 d=16 s=64 n=4 i=1 o=2 w=128 T=333"},
    /* head dims */
    {"Dqk>Dv", "D=16/8"},
    {"Dqk<Dv", "D=5/17"},
    {"D3", "D=3/3"},
    {"D5-17", "D=5/17 H=4/2 T=60"},
    {"D17", "D=17/17 T=50"},
    {"D1", "D=1/1 T=40"},
    {"D64", "D=64/32 H=2/1 T=80"},
    /* varlen batches, empty sequences */
    {"B3-zero", "T=37,0,64"},
    {"B2-first0", "T=0,50"},
    {"B3-last0", "T=20,33,0"},
    {"B8-mixed", "T=5,0,17,64,1,33,8,100 H=4/2"},
    {"B4-short", "T=1,2,3,4"},
    {"B3-ext", "T=40,0,77 c=ext"},
    {"B3-linpe", "T=19,0,70 c=linpe H=4/2"},
    {"B2-lin", "T=33,45 c=lin D=5/3"},
    /* compression modes */
    {"mean", "c=mean T=80"},
    {"lin", "c=lin T=80"},
    {"linpe", "c=linpe T=80"},
    {"ext", "c=ext T=80"},
    {"lin-Dqk!=Dv", "c=lin D=6/3 T=60 H=4/2"},
    {"linpe-d=l", "c=linpe l=8 d=8 s=16 T=70"},
    {"ext-d1", "c=ext l=4 d=1 s=4 T=50"},
    /* selection count */
    {"n>Ns", "n=8 T=40"},
    {"n>Ns-T1", "n=5 T=1"},
    {"n0", "n=0 i=1 o=2"},
    {"n0-w0", "n=0 w=0 T=60"},
    {"n0-ext", "n=0 c=ext T=50"},
    {"n=forced", "n=2 i=1 o=1 T=90"},
    {"n1-forced1", "n=1 i=1 o=0 T=90"},
    {"n1-local1", "n=1 i=0 o=1 T=90"},
    {"n16", "n=16 i=1 o=2 l=4 d=2 s=4 T=120"},
    /* window */
    {"w0", "w=0 T=60"},
    {"w1", "w=1 T=60"},
    {"w>=T", "w=1000 T=200"},
    {"w=T", "w=50 T=50"},
    {"w0-lin", "w=0 c=lin T=50"},
    /* forced blocks */
    {"i0o0", "n=3 i=0 o=0 T=100"},
    {"i1o0", "n=3 i=1 o=0 T=100"},
    {"i0o1", "n=3 i=0 o=1 T=100"},
    {"i0o2", "n=3 i=0 o=2 T=100"},
    {"i2o2", "n=5 i=2 o=2 T=130"},
    {"i3o3", "n=6 i=3 o=3 T=130"},
    {"i3o0", "n=3 i=3 o=0 T=130"},
    {"i0o3", "n=4 i=0 o=3 T=130"},
    {"i2o1-s4", "n=4 i=2 o=1 l=4 d=2 s=4 T=60"},
    /* block geometry */
    {"l=d=ls8", "l=8 d=8 s=8 T=70 n=3"},
    {"l=d=ls16", "l=16 d=16 s=16 T=100 n=3"},
    {"l=d=ls1", "l=1 d=1 s=1 T=30 n=4 i=1 o=1"},
    {"l=ls", "l=16 d=4 s=16 T=90"},
    {"d=l<ls", "l=8 d=8 s=32 T=90 n=2"},
    {"d1", "l=4 d=1 s=8 T=60"},
    {"ls=3l", "l=4 d=2 s=12 T=70"},
    {"paper-ish", "H=4/1 D=16/8 l=32 d=16 s=64 n=4 i=1 o=2 w=128 T=300"},
    /* scale */
    {"scale0.3", "sc=0.3"},
    {"scale1.7", "sc=1.7 T=60"},
    {"scale0.05", "sc=0.05 T=60"},
    {"scale4", "sc=4 T=50 D=4/4"},
    /* layouts */
    {"strided-mean", "lay=strided T=60 H=4/2"},
    {"strided-lin", "lay=strided c=lin T=50"},
    {"strided-linpe", "lay=strided c=linpe T=50 D=5/3"},
    {"strided-ext", "lay=strided c=ext T=50 H=4/2"},
    {"strided-varlen", "lay=strided T=30,0,41"},
    {"strided-n0", "lay=strided n=0 T=40"},
    {"strided-w0", "lay=strided w=0 T=40"},
    {"distinct-mean", "lay=distinct T=60 H=4/2"},
    {"distinct-lin", "lay=distinct c=linpe T=50"},
    {"distinct-ext", "lay=distinct c=ext T=50"},
    {"distinct-varlen", "lay=distinct T=25,0,30 H=3/1"},
    /* caller-given indices */
    {"fix-mean", "fix T=70"},
    {"fix-strided", "fix lay=strided T=70 H=4/2"},
    {"fix-n>Ns", "fix n=6 T=40"},
    {"fix-varlen", "fix T=30,0,50"},
    {"fix-i0o0", "fix n=3 i=0 o=0 T=90"},
    /* long sequences: tiny heads */
    {"long1000", "T=1000 H=2/1 D=4/4 l=16 d=8 s=32 n=4 w=64"},
    {"long2048-dense", "T=2048 H=2/1 D=4/3 l=32 d=16 s=64 n=4 i=1 o=2 w=4096"},
    {"long3001-l=d=ls", "T=3001 H=1/1 D=3/5 l=16 d=16 s=16 n=8 i=1 o=2 w=100"},
    {"long-varlen-lin", "T=1500,0,999 H=2/2 D=4/4 l=16 d=8 s=32 n=3 w=128 c=lin"},
    {"long-ext", "T=1200 H=2/1 D=5/3 l=32 d=16 s=64 n=5 i=1 o=2 w=256 c=ext"},
    {"long-strided", "T=700 H=2/1 D=3/3 l=8 d=4 s=16 n=6 i=2 o=1 w=50 lay=strided"},
    {"long-G8", "T=512 H=8/1 D=4/4 l=16 d=8 s=32 n=4 w=128"},
};

/* ---------------------------------------------------------------- small corpus */
static const spec small_specs[] = {
    {"s-T1", "T=1 D=4/4"},
    {"s-T<l", "T=5 D=4/4"},
    {"s-basic", "T=24 D=4/4"},
    {"s-G3", "H=3/1 D=3/5 T=20"},
    {"s-G16", "H=16/1 D=4/4 T=40"},
    {"s-G2-hkv2", "H=4/2 D=4/4 T=20"},
    {"s-varlen", "T=9,0,17 D=4/4"},
    {"s-lin", "c=lin D=4/4 T=20"},
    {"s-linpe", "c=linpe D=3/5 T=20"},
    {"s-ext", "c=ext D=4/4 T=20,0,13"},
    {"s-n0", "n=0 T=20 D=4/4"},
    {"s-w0", "w=0 T=20 D=4/4"},
    {"s-w>=T", "w=64 T=20 D=4/4"},
    {"s-n>Ns", "n=4 T=20 D=4/4"},
    {"s-l=d=ls", "l=4 d=4 s=4 n=3 i=1 o=1 T=18 D=4/4"},
    {"s-i0o0", "n=2 i=0 o=0 T=30 D=4/4 l=4 d=2 s=4"},
    {"s-i3o3", "n=6 i=3 o=3 T=30 D=4/4 l=2 d=1 s=2"},
    {"s-scale", "sc=0.7 T=20 D=4/4"},
    {"s-strided", "lay=strided T=18,0,7 H=4/2 D=3/3"},
    {"s-distinct", "lay=distinct c=lin T=20 D=4/4"},
    {"s-fix", "fix T=30 D=4/4"},
    {"s-fix-strided", "fix lay=strided T=25 H=2/2 D=4/3"},
};

/* ---------------------------------------------------------------- gpu corpus
 * The sizes models use, for GPU backends (test_oracle <backend> <modes> gpu on a
 * device): the paper's block parameters, head dims 64 / 128 / 192, the GQA
 * groups of common models (G = 1, 4, 7, 8 and 16), T up to 8192, ragged packed
 * batches, a fixed-indices case, l_s = 128.
 * Every case checks a sample of about 256 tokens per sequence (rows=256): the
 * fp64 oracle is one scalar thread, and over every row it took 276 s a mode
 * (149 s for g-G16-Dqk192 alone, x86 at -O3), so bf16 and fixed outran
 * device_check.sh's 500 s on the H200's host. 256 keep the first and last 48
 * tokens and 32 groups of five spread over the rest (each at another offset in
 * its blocks): 3324 of the 50364 tokens, and about 15 s of oracle a mode, while
 * every head, every branch, both ends of each sequence and block edges all
 * along it are still checked. */
#define PAPER "l=32 d=16 s=64 n=16 i=1 o=2 w=512 rows=256"
static const spec gpu_specs[] = {
    {"g-G1-8192", "T=8192 H=4/4 D=128/128 " PAPER},
    {"g-G4-packed", "T=4096,3001,0,1100 H=32/8 D=128/128 " PAPER},
    {"g-G7-5000", "T=5000 H=28/4 D=128/128 " PAPER},
    {"g-G8-8192-D64", "T=8192 H=16/2 D=64/64 " PAPER},
    {"g-G16-Dqk192", "T=6000,2000 H=64/4 D=192/128 " PAPER},
    {"g-G4-D96-ragged", "T=2500,700,33 H=8/2 D=96/64 " PAPER},
    {"g-G1-fix", "fix T=3001 H=4/4 D=128/128 " PAPER},
    {"g-G4-lin", "T=2049 H=16/4 D=64/64 c=lin " PAPER},
    /* l_s = 128: two 64-key tiles per selected block (no other corpus case has l_s > 64) */
    {"g-G4-ls128", "T=3000 H=16/4 D=64/64 l=32 d=16 s=128 n=8 i=1 o=2 w=256 rows=256"},
    {"g-G16-ls128", "T=1500 H=16/1 D=128/128 l=32 d=16 s=128 n=6 i=1 o=2 w=256 rows=256"},
};
#undef PAPER

/* Number of seeded random cases appended to the full corpus. */
#define FULL_RANDOM 40

uint64_t tk_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int64_t pick(uint64_t *st, int64_t lo, int64_t hi) /* uniform in [lo, hi] */
{
    return lo + (int64_t)(tk_splitmix64(st) % (uint64_t)(hi - lo + 1));
}

static uint64_t label_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; ++s) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

static void case_defaults(tk_case *c, const char *label)
{
    memset(c, 0, sizeof *c);
    snprintf(c->label, sizeof c->label, "%s", label);
    nsa_config *g = &c->cfg;
    g->num_q_heads = 2;
    g->num_kv_heads = 1;
    g->head_dim_qk = 8;
    g->head_dim_v = 8;
    g->cmp_block = 8;
    g->cmp_stride = 4;
    g->slc_block = 16;
    g->num_selected = 3;
    g->num_init = 1;
    g->num_local = 1;
    g->window = 16;
    g->scale = 0.0f;
    g->compress = NSA_COMPRESS_MEAN;
    g->dtype = NSA_DTYPE_F32;
    c->batch = 1;
    c->cu_seqlens[1] = 40;
    c->layout = TK_LAYOUT_DENSE;
    c->seed = label_hash(label);
}

/* Parses a spec (see the top of the file); aborts on a malformed one, which is a
 * bug in the table above. */
static void parse_spec(tk_case *c, const spec *s)
{
    case_defaults(c, s->label);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s->text);
    nsa_config *g = &c->cfg;
    for (char *tok = strtok(buf, " "); tok; tok = strtok(NULL, " ")) {
        char *eq = strchr(tok, '=');
        if (!eq) {
            if (strcmp(tok, "fix") == 0) {
                c->fixed_indices = 1;
                continue;
            }
            goto bad;
        }
        *eq = '\0';
        const char *key = tok, *val = eq + 1;
        if (strcmp(key, "T") == 0) {
            int64_t b = 0, acc = 0;
            char vbuf[128];
            snprintf(vbuf, sizeof vbuf, "%s", val);
            for (char *p = vbuf; p && *p;) {
                char *comma = strchr(p, ',');
                if (comma) *comma = '\0';
                if (b >= TK_MAX_BATCH) goto bad;
                acc += strtoll(p, NULL, 10);
                c->cu_seqlens[++b] = acc;
                p = comma ? comma + 1 : NULL;
            }
            c->batch = b;
        } else if (strcmp(key, "H") == 0) {
            if (sscanf(val, "%" SCNd64 "/%" SCNd64, &g->num_q_heads, &g->num_kv_heads) != 2) goto bad;
        } else if (strcmp(key, "D") == 0) {
            if (sscanf(val, "%" SCNd64 "/%" SCNd64, &g->head_dim_qk, &g->head_dim_v) != 2) goto bad;
        } else if (strcmp(key, "l") == 0) {
            g->cmp_block = strtoll(val, NULL, 10);
        } else if (strcmp(key, "d") == 0) {
            g->cmp_stride = strtoll(val, NULL, 10);
        } else if (strcmp(key, "s") == 0) {
            g->slc_block = strtoll(val, NULL, 10);
        } else if (strcmp(key, "n") == 0) {
            g->num_selected = strtoll(val, NULL, 10);
        } else if (strcmp(key, "i") == 0) {
            g->num_init = strtoll(val, NULL, 10);
        } else if (strcmp(key, "o") == 0) {
            g->num_local = strtoll(val, NULL, 10);
        } else if (strcmp(key, "w") == 0) {
            g->window = strtoll(val, NULL, 10);
        } else if (strcmp(key, "sc") == 0) {
            g->scale = strtof(val, NULL);
        } else if (strcmp(key, "c") == 0) {
            if (strcmp(val, "mean") == 0) {
                g->compress = NSA_COMPRESS_MEAN;
            } else if (strcmp(val, "lin") == 0) {
                g->compress = NSA_COMPRESS_LINEAR;
            } else if (strcmp(val, "linpe") == 0) {
                g->compress = NSA_COMPRESS_LINEAR;
                c->use_pe = 1;
            } else if (strcmp(val, "ext") == 0) {
                g->compress = NSA_COMPRESS_EXTERNAL;
            } else {
                goto bad;
            }
        } else if (strcmp(key, "rows") == 0) {
            c->rows = strtoll(val, NULL, 10);
            if (c->rows < 0) goto bad;
        } else if (strcmp(key, "lay") == 0) {
            if (strcmp(val, "dense") == 0) c->layout = TK_LAYOUT_DENSE;
            else if (strcmp(val, "strided") == 0) c->layout = TK_LAYOUT_STRIDED;
            else if (strcmp(val, "distinct") == 0) c->layout = TK_LAYOUT_DISTINCT;
            else goto bad;
        } else {
            goto bad;
        }
    }
    return;
bad:
    fprintf(stderr, "testkit: malformed corpus spec '%s' (%s)\n", s->text, s->label);
    abort();
}

/* A random valid configuration with a modest cost. */
static void random_case(tk_case *c, int index)
{
    char label[TK_LABEL_MAX];
    snprintf(label, sizeof label, "rand%02d", index);
    case_defaults(c, label);
    uint64_t st = 0x4E53415F434F5250ull + (uint64_t)index * 0x1000193ull;
    nsa_config *g = &c->cfg;

    static const int64_t groups[] = {1, 2, 3, 4, 8, 16};
    int64_t G = groups[pick(&st, 0, 5)];
    g->num_kv_heads = G >= 8 ? 1 : pick(&st, 1, 2);
    g->num_q_heads = G * g->num_kv_heads;
    int64_t dmax = G >= 8 ? 6 : 20;
    g->head_dim_qk = pick(&st, 1, dmax);
    g->head_dim_v = pick(&st, 0, 2) == 0 ? g->head_dim_qk : pick(&st, 1, dmax);

    static const int64_t strides[] = {1, 2, 4, 8};
    g->cmp_stride = strides[pick(&st, 0, 3)];
    g->cmp_block = g->cmp_stride * pick(&st, 1, 4);
    /* l_s: a multiple of d that is >= l */
    g->slc_block = g->cmp_block + g->cmp_stride * pick(&st, 0, 4);
    g->num_init = pick(&st, 0, 3);
    g->num_local = pick(&st, 0, 3);
    g->num_selected = pick(&st, 0, 5) == 0 ? 0 : g->num_init + g->num_local + pick(&st, 0, 4);

    c->batch = pick(&st, 1, 4);
    int64_t acc = 0, maxlen = 0;
    for (int64_t b = 1; b <= c->batch; ++b) {
        int64_t len = pick(&st, 0, 7) == 0 ? 0 : pick(&st, 1, 260);
        acc += len;
        if (len > maxlen) maxlen = len;
        c->cu_seqlens[b] = acc;
    }
    if (acc == 0) c->cu_seqlens[c->batch] = acc = 1 + pick(&st, 0, 50);
    if (maxlen == 0) maxlen = acc;

    int64_t wr = pick(&st, 0, 5);
    g->window = wr == 0 ? 0 : wr == 1 ? maxlen + pick(&st, 0, 10) : pick(&st, 1, 64);
    if (g->window == 0 && g->num_selected == 0) g->window = 8;
    g->scale = pick(&st, 0, 3) == 0 ? (float)pick(&st, 1, 20) / 10.0f : 0.0f;
    int64_t cm = pick(&st, 0, 3);
    g->compress = cm == 0 ? NSA_COMPRESS_EXTERNAL : cm == 1 ? NSA_COMPRESS_LINEAR : NSA_COMPRESS_MEAN;
    if (g->compress == NSA_COMPRESS_LINEAR) c->use_pe = (int)pick(&st, 0, 1);
    int64_t lay = pick(&st, 0, 19);
    c->layout = lay < 6 ? TK_LAYOUT_STRIDED : lay < 9 ? TK_LAYOUT_DISTINCT : TK_LAYOUT_DENSE;
    c->fixed_indices = g->num_selected > 0 && pick(&st, 0, 6) == 0;
}

int tk_corpus(const char *name, tk_case **cases)
{
    if (!name || !cases) return -1;
    const spec *specs;
    int nspec, nrand;
    if (strcmp(name, "full") == 0) {
        specs = full_specs;
        nspec = (int)(sizeof full_specs / sizeof full_specs[0]);
        nrand = FULL_RANDOM;
    } else if (strcmp(name, "small") == 0) {
        specs = small_specs;
        nspec = (int)(sizeof small_specs / sizeof small_specs[0]);
        nrand = 0;
    } else if (strcmp(name, "gpu") == 0) {
        specs = gpu_specs;
        nspec = (int)(sizeof gpu_specs / sizeof gpu_specs[0]);
        nrand = 0;
    } else {
        return -1;
    }
    tk_case *out = calloc((size_t)(nspec + nrand), sizeof *out);
    if (!out) return -1;
    for (int i = 0; i < nspec; ++i) parse_spec(&out[i], &specs[i]);
    for (int i = 0; i < nrand; ++i) random_case(&out[nspec + i], i);
    *cases = out;
    return nspec + nrand;
}

void tk_case_set_dtype(tk_case *c, nsa_dtype dtype)
{
    c->cfg.dtype = dtype;
}

nsa_dtype tk_float_dtype(nsa_dtype dt)
{
    return dt == NSA_DTYPE_F64 ? NSA_DTYPE_F64 : NSA_DTYPE_F32;
}

int64_t tk_case_tokens(const tk_case *c)
{
    return c->cu_seqlens[c->batch];
}

int64_t tk_num_cmp_blocks(const nsa_config *cfg, int64_t len)
{
    if (len < cfg->cmp_block) return 0;
    return (len - cfg->cmp_block) / cfg->cmp_stride + 1;
}

int64_t tk_num_slc_blocks(const nsa_config *cfg, int64_t len)
{
    return len / cfg->slc_block + (len % cfg->slc_block > 0); /* ceil without len + l_s - 1 overflowing */
}

/* Length of sequence b, or -1 when cu_seqlens is not a valid batch there. */
static int64_t seq_len(const tk_case *c, int64_t b)
{
    int64_t len;
    return nsa_ck_sub(c->cu_seqlens[b + 1], c->cu_seqlens[b], &len) || len < 0 ? -1 : len;
}

int64_t tk_case_total_cmp(const tk_case *c)
{
    int64_t total = 0;
    for (int64_t b = 0; b < c->batch; ++b)
        if (nsa_ck_add(total, tk_num_cmp_blocks(&c->cfg, seq_len(c, b)), &total)) return INT64_MAX;
    return total;
}

int64_t tk_case_max_slc(const tk_case *c)
{
    int64_t m = 0;
    for (int64_t b = 0; b < c->batch; ++b) {
        int64_t ns = tk_num_slc_blocks(&c->cfg, seq_len(c, b));
        if (ns > m) m = ns;
    }
    return m;
}

void tk_case_token(const tk_case *c, int64_t t, int64_t *seq, int64_t *local)
{
    int64_t b = 0;
    while (b + 1 < c->batch && c->cu_seqlens[b + 1] <= t) ++b;
    if (seq) *seq = b;
    if (local) *local = t - c->cu_seqlens[b];
}

double tk_case_scale(const tk_case *c)
{
    if (c->cfg.scale != 0.0f) return (double)c->cfg.scale;
    return (double)(float)(1.0 / sqrt((double)c->cfg.head_dim_qk));
}

/* Tokens always sampled at each end of a sequence: the first cover T < l, T < w
 * at small w and the first selection blocks (where the forced initial and local
 * blocks overlap); the last, the causal end. */
#define SAMPLE_EDGE 48
/* Tokens of a group of the sampled interior (tk_case_sample). */
#define SAMPLE_GROUP 5

int64_t tk_case_sample(const tk_case *c, uint8_t *mask)
{
    const nsa_config *g = &c->cfg;
    const int64_t T = tk_case_tokens(c);
    if (c->rows <= 0) {
        memset(mask, 1, (size_t)T);
        return T;
    }
    const int64_t l = g->cmp_block, d = g->cmp_stride, ls = g->slc_block;
    const int64_t groups = (c->rows - 2 * SAMPLE_EDGE) / SAMPLE_GROUP;
    int64_t count = 0;
    for (int64_t b = 0; b < c->batch; ++b) {
        const int64_t len = seq_len(c, b);
        uint8_t *m = mask + c->cu_seqlens[b];
        for (int64_t t = 0; t < len; ++t) m[t] = t < SAMPLE_EDGE || t >= len - SAMPLE_EDGE;
        /* group k sits in the middle of the k-th of `groups` equal parts of the
         * interior, so its offsets in the blocks differ from group to group */
        const int64_t span = len - 2 * SAMPLE_EDGE;
        for (int64_t k = 0; k < groups && span > 0; ++k) {
            const int64_t a = SAMPLE_EDGE + (2 * k + 1) * span / (2 * groups);
            const int64_t js = (a / ls + 1) * ls; /* the next selection block starts here */
            /* the first token after a that sees one more compressed block: i*d + l - 1 */
            const int64_t e = a < l - 1 ? l - 1 : ((a - (l - 1)) / d + 1) * d + l - 1;
            const int64_t pick[SAMPLE_GROUP] = {a, js - 1, js, e - 1, e};
            for (int p = 0; p < SAMPLE_GROUP; ++p)
                if (pick[p] < len) m[pick[p]] = 1;
        }
        for (int64_t t = 0; t < len; ++t) count += m[t];
    }
    return count;
}

int tk_block_forced(const nsa_config *cfg, int64_t t_local, int64_t j)
{
    int64_t cur = t_local / cfg->slc_block;
    if (j < cfg->num_init) return 1;
    return j > cur - cfg->num_local && j <= cur;
}

const char *tk_case_describe(const tk_case *c, char *buf, size_t size)
{
    const nsa_config *g = &c->cfg;
    static const char *modes[] = {"mean", "lin", "ext"};
    static const char *lays[] = {"dense", "strided", "distinct"};
    char lens[160], rows[32] = "";
    size_t used = 0;
    lens[0] = '\0';
    for (int64_t b = 0; b < c->batch && used < sizeof lens; ++b)
        used += (size_t)snprintf(lens + used, sizeof lens - used, "%s%lld", b ? "," : "", (long long)seq_len(c, b));
    if (c->rows > 0) snprintf(rows, sizeof rows, " rows=%lld", (long long)c->rows);
    snprintf(buf, size,
             "%s %s B=%lld T=[%s] H=%lld/%lld D=%lld/%lld l=%lld d=%lld ls=%lld n=%lld init=%lld "
             "local=%lld w=%lld %s%s scale=%g %s%s%s",
             c->label, nsa_dtype_name(g->dtype), (long long)c->batch, lens, (long long)g->num_q_heads,
             (long long)g->num_kv_heads, (long long)g->head_dim_qk, (long long)g->head_dim_v,
             (long long)g->cmp_block, (long long)g->cmp_stride, (long long)g->slc_block,
             (long long)g->num_selected, (long long)g->num_init, (long long)g->num_local,
             (long long)g->window, (unsigned)g->compress < 3 ? modes[g->compress] : "?",
             c->use_pe ? "+pe" : "", (double)g->scale,
             (unsigned)c->layout < 3 ? lays[c->layout] : "?", c->fixed_indices ? " fixed" : "", rows);
    return buf;
}
