/*
 * choose.cc -- the CUDA backend's kernel chooser (choose.h): per stage, the
 * first kernel of the class's preference list that takes the plan's shape
 * and whose tile fits the class's shared memory, else the reference kernel.
 * The tile functions are in kernels/cuda/tiles.h; docs/cuda.md says why each
 * class prefers what it does.
 */
#include "choose.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

namespace nsa_cuda {

Limits class_limits(Cls cls)
{
    switch (cls) {
    case CLS_SM90: return Limits{CLS_SM90, 227 * 1024, 228 * 1024};
    case CLS_SM80: return Limits{CLS_SM80, 163 * 1024, 164 * 1024};
    case CLS_SM86: break;
    }
    return Limits{CLS_SM86, 99 * 1024, 100 * 1024};
}

const char *class_name(Cls cls)
{
    return cls == CLS_SM90 ? "sm90" : cls == CLS_SM80 ? "sm80" : "sm86";
}

Cls device_class(int major, int minor, int64_t smem_block, bool sm90a)
{
    (void)minor;
    if (major == 9 && sm90a) return CLS_SM90;
    return smem_block >= class_limits(CLS_SM80).smem_block ? CLS_SM80 : CLS_SM86;
}

static void say(char *msg, size_t size, const char *fmt, ...)
{
    if (!msg || size == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, size, fmt, ap);
    va_end(ap);
}

/* Can a device of class `dev` stand in for class `want` (its instructions and at least its shared memory)? */
static bool covers(Cls dev, Cls want)
{
    if (want == CLS_SM90) return dev == CLS_SM90;
    if (want == CLS_SM80) return dev == CLS_SM90 || dev == CLS_SM80;
    return true;
}

bool parse_target(const char *s, Cls device, Cls *out, char *msg, size_t msg_size)
{
    Cls want;
    if (strcmp(s, "sm90") == 0)
        want = CLS_SM90;
    else if (strcmp(s, "sm80") == 0)
        want = CLS_SM80;
    else if (strcmp(s, "sm86") == 0 || strcmp(s, "sm89") == 0)
        want = CLS_SM86;
    else {
        say(msg, msg_size, "NSA_CUDA_TARGET=%s: not a device class (sm80, sm86, sm89 or sm90)", s);
        return false;
    }
    if (!covers(device, want)) {
        say(msg, msg_size, "NSA_CUDA_TARGET=%s: this device is of class %s, which cannot run as %s", s,
            class_name(device), class_name(want));
        return false;
    }
    *out = want;
    return true;
}

static const char *const k_names[K_COUNT] = {
    "-",           "compress_mean",   "compress_linear", "compress_copy", "attn_ref",        "attn_sm80",
    "attn_sm90",   "scores_ref",      "scores_sm80",     "scores_sm80_g16", "scores_sm80_kq", "scores_sm90_g16", "topn",
    "slc_sm80",    "slc_sm80_g16",    "slc_sm80_blk",    "slc_sm90_blk",    "combine",         "combine_in_win",  "bwd_attn_ref",    "bwd_attn_sm80",   "bwd_attn_sm90",   "bwd_compress_mean",
    "bwd_compress_linear", "bwd_store", "decode_append", "decode_append_one", "decode_split", "decode_sm80", "decode_sm80_wide",
    "decode_sm80_probs",
};

const char *kern_name(Kern k) { return k >= 0 && k < K_COUNT ? k_names[k] : "?"; }

/* ------------------------------------------------------------ NSA_CUDA_FORCE */

/* the stage keys of NSA_CUDA_FORCE and the stages each sets */
struct ForceKey {
    const char *name;
    nsa_stage st[2];
    int nst;
};
static const ForceKey force_keys[] = {
    {"cmp_attn", {NSA_STAGE_CMP_ATTN, NSA_STAGE_CMP_ATTN}, 1},
    {"block_scores", {NSA_STAGE_BLOCK_SCORES, NSA_STAGE_SCORES_TOPN}, 2},
    {"scores_topn", {NSA_STAGE_BLOCK_SCORES, NSA_STAGE_SCORES_TOPN}, 2},
    {"select_topn", {NSA_STAGE_SELECT_TOPN, NSA_STAGE_SELECT_TOPN}, 1},
    {"slc_attn", {NSA_STAGE_SLC_ATTN, NSA_STAGE_SLC_ATTN}, 1},
    {"win_attn", {NSA_STAGE_WIN_ATTN, NSA_STAGE_WIN_ATTN}, 1},
    {"combine", {NSA_STAGE_COMBINE, NSA_STAGE_COMBINE}, 1},
    {"bwd_cmp_attn", {NSA_STAGE_BWD_CMP_ATTN, NSA_STAGE_BWD_CMP_ATTN}, 1},
    {"bwd_slc_attn", {NSA_STAGE_BWD_SLC_ATTN, NSA_STAGE_BWD_SLC_ATTN}, 1},
    {"bwd_win_attn", {NSA_STAGE_BWD_WIN_ATTN, NSA_STAGE_BWD_WIN_ATTN}, 1},
    {"decode_append", {NSA_STAGE_DECODE_APPEND, NSA_STAGE_DECODE_APPEND}, 1},
    {"decode_attn", {NSA_STAGE_DECODE_ATTN, NSA_STAGE_DECODE_ATTN}, 1},
};

/* the kernels a stage can run; the first is its reference */
static int stage_kernels(nsa_stage st, const Kern **out)
{
    static const Kern cmp[] = {K_ATTN_REF, K_ATTN_SM80, K_ATTN_SM90};
    static const Kern sc[] = {K_SCORES_REF, K_SCORES_SM80, K_SCORES_SM80_G16, K_SCORES_SM80_KQ, K_SCORES_SM90_G16};
    static const Kern tn[] = {K_TOPN};
    static const Kern slc[] = {K_ATTN_REF, K_SLC_SM80, K_SLC_SM80_G16, K_SLC_SM80_BLK, K_SLC_SM90_BLK};
    static const Kern cb[] = {K_COMBINE, K_COMBINE_IN_WIN};
    static const Kern bwd[] = {K_BWD_ATTN_REF, K_BWD_ATTN_SM80, K_BWD_ATTN_SM90};
    static const Kern dec[] = {K_DECODE_SPLIT, K_DECODE_SM80, K_DECODE_SM80_WIDE, K_DECODE_SM80_PROBS};
    static const Kern app[] = {K_DECODE_APPEND, K_DECODE_APPEND_ONE};
    switch (st) {
    case NSA_STAGE_CMP_ATTN:
    case NSA_STAGE_WIN_ATTN: *out = cmp; return 3;
    case NSA_STAGE_BLOCK_SCORES:
    case NSA_STAGE_SCORES_TOPN: *out = sc; return 5;
    case NSA_STAGE_SELECT_TOPN: *out = tn; return 1;
    case NSA_STAGE_SLC_ATTN: *out = slc; return 5;
    case NSA_STAGE_COMBINE: *out = cb; return 2;
    case NSA_STAGE_BWD_CMP_ATTN:
    case NSA_STAGE_BWD_SLC_ATTN:
    case NSA_STAGE_BWD_WIN_ATTN: *out = bwd; return 3;
    case NSA_STAGE_DECODE_ATTN: *out = dec; return 4;
    case NSA_STAGE_DECODE_APPEND: *out = app; return 2;
    default: *out = nullptr; return 0;
    }
}

static void set_ref(Force *f, nsa_stage st)
{
    const Kern *ks;
    if (stage_kernels(st, &ks) > 0) f->k[st] = ks[0];
}

bool parse_force(const char *s, Force *f, char *msg, size_t msg_size)
{
    memset(f, 0, sizeof *f);
    if (!s) return true;
    const char *p = s;
    while (*p) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[96];
        if (len >= sizeof item) {
            say(msg, msg_size, "NSA_CUDA_FORCE: item '%.40s...' is too long", p);
            return false;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        p += len + (end ? 1 : 0);
        if (len == 0) continue;
        if (strcmp(item, "ref") == 0) {
            for (int i = 0; i < NSA_STAGE_COUNT; i++) set_ref(f, (nsa_stage)i);
            continue;
        }
        char *colon = strchr(item, ':');
        if (!colon) {
            say(msg, msg_size, "NSA_CUDA_FORCE: '%s' is neither 'ref' nor 'stage:kernel'", item);
            return false;
        }
        *colon = '\0';
        const char *kname = colon + 1;
        const ForceKey *key = nullptr;
        for (const ForceKey &fk : force_keys)
            if (strcmp(fk.name, item) == 0) key = &fk;
        if (!key) {
            say(msg, msg_size,
                "NSA_CUDA_FORCE: '%s' is not a stage (cmp_attn, block_scores, scores_topn, select_topn, slc_attn, "
                "win_attn, combine, bwd_cmp_attn, bwd_slc_attn, bwd_win_attn, decode_append, decode_attn)",
                item);
            return false;
        }
        const Kern *ks;
        const int nk = stage_kernels(key->st[0], &ks);
        Kern k = K_NONE;
        if (strcmp(kname, "ref") == 0) k = ks[0];
        for (int i = 0; i < nk && k == K_NONE; i++)
            if (strcmp(kern_name(ks[i]), kname) == 0) k = ks[i];
        if (k == K_NONE) {
            char list[256] = "";
            size_t used = 0;
            for (int i = 0; i < nk; i++) {
                const int w = snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", kern_name(ks[i]));
                if (w > 0 && (size_t)w < sizeof list - used) used += (size_t)w;
            }
            say(msg, msg_size, "NSA_CUDA_FORCE: '%s' is not a kernel of stage %s (ref, %s)", kname, key->name, list);
            return false;
        }
        for (int i = 0; i < key->nst; i++) f->k[key->st[i]] = k;
    }
    return true;
}

/* ------------------------------------------------------------ the chooser */

namespace {

struct Shape {
    const nsa_config *cfg;
    int64_t G, max_ns;
    int dqkp, dvp;
    bool tc; /* 16-bit inputs with heads the tensor-core kernels take */
    int64_t limit;
};

/* Does kernel k take stage st of this shape? Fills c (tile, rows) when it does. */
bool takes(Kern k, nsa_stage st, const Limits &lim, const Shape &s, StageChoice *c)
{
    const nsa_config &cfg = *s.cfg;
    memset(c, 0, sizeof *c);
    c->k = k;
    const int mode = st == NSA_STAGE_WIN_ATTN ? 2 : 0;
    switch (k) {
    case K_ATTN_REF:
    case K_SCORES_REF:
    case K_TOPN:
    case K_COMBINE: return true;
    case K_ATTN_SM80:
        if (!s.tc) return false;
        c->attn = pick_attn_sm80(mode, s.dqkp, s.dvp, s.limit, lim.smem_sm);
        return c->attn.bn > 0;
    case K_ATTN_SM90:
        if (!s.tc || lim.cls != CLS_SM90) return false;
        c->attn = pick_attn_sm90(mode, s.dqkp, s.dvp, s.limit);
        return c->attn.bn > 0;
    case K_SCORES_SM80:
    case K_SCORES_SM80_G16:
    case K_SCORES_SM80_KQ: {
        if (!s.tc || s.G > TC_BM || (k == K_SCORES_SM80_G16 && s.G != 16) ||
            (k == K_SCORES_SM80_KQ && !scores_sm80_kq_takes(s.G, s.dqkp)))
            return false;
        const int gp = k == K_SCORES_SM80 ? 0 : scores_kq_gp(s.G);
        const int qt = gp > 0 ? scores_kq_tokens(s.G) : tile_tokens(s.G);
        /* scores_sm80_kq may rank as it goes where that pays and the kept set fits a warp (n <= 32) */
        const ScoresRing ring = {qt, cfg.cmp_block, cfg.cmp_stride, cfg.slc_block, cfg.num_selected};
        const bool ranks = k == K_SCORES_SM80_KQ && scores_kq_ring_pays(gp) && cfg.num_selected >= 1 &&
                           cfg.num_selected <= scores_kq_ring_max_n;
        c->scores = pick_scores_sm80(gp, s.dqkp, scores_rows_smem(qt, s.max_ns), s.limit, lim.smem_sm,
                                     ranks ? &ring : nullptr);
        c->rows_smem = c->scores.rows;
        return c->scores.bn > 0;
    }
    case K_SCORES_SM90_G16:
        if (!s.tc || s.G != 16 || lim.cls != CLS_SM90) return false;
        c->scores = pick_scores_sm90_g16(s.dqkp, scores_rows_smem(tile_tokens(s.G), s.max_ns), s.limit);
        c->rows_smem = true;
        return c->scores.bn > 0;
    case K_SLC_SM80:
        return s.tc && slc_sm80_takes(s.dqkp, s.dvp) &&
               (int64_t)slc_sm80_smem(s.dqkp, s.dvp, cfg.num_selected, cfg.slc_block) <= s.limit;
    case K_SLC_SM80_G16:
        if (!s.tc) return false;
        c->slc = pick_slc_sm80_g16(s.G, cfg.slc_block, cfg.num_selected, s.dqkp, s.dvp, s.limit);
        return c->slc.ok;
    case K_SLC_SM80_BLK:
        return s.tc && slc_sm80_blk_takes(s.G, s.dqkp, s.dvp) &&
               (int64_t)slc_sm80_blk_smem(s.dqkp, s.dvp) <= s.limit;
    case K_SLC_SM90_BLK:
        return s.tc && lim.cls == CLS_SM90 && slc_sm90_blk_takes(s.G, s.dqkp, s.dvp) &&
               (int64_t)slc_sm90_blk_smem(s.dqkp, s.dvp) <= s.limit;
    default: return false;
    }
}

/* the class's preference, best first; the reference last */
int preference(nsa_stage st, Kern *out)
{
    int n = 0;
    switch (st) {
    case NSA_STAGE_CMP_ATTN:
    case NSA_STAGE_WIN_ATTN:
        out[n++] = K_ATTN_SM90;
        out[n++] = K_ATTN_SM80;
        out[n++] = K_ATTN_REF;
        break;
    case NSA_STAGE_BLOCK_SCORES:
    case NSA_STAGE_SCORES_TOPN:
        out[n++] = K_SCORES_SM90_G16;
        out[n++] = K_SCORES_SM80_G16;
        out[n++] = K_SCORES_SM80_KQ;
        out[n++] = K_SCORES_SM80;
        out[n++] = K_SCORES_REF;
        break;
    case NSA_STAGE_SELECT_TOPN: out[n++] = K_TOPN; break;
    case NSA_STAGE_SLC_ATTN:
        out[n++] = K_SLC_SM80_G16; /* G = 16: 128 rows share each fetch without partial states */
        out[n++] = K_SLC_SM90_BLK;
        out[n++] = K_SLC_SM80_BLK;
        out[n++] = K_SLC_SM80;
        out[n++] = K_ATTN_REF;
        break;
    default: break;
    }
    return n;
}

bool ck_tc(Kern k) { return k == K_ATTN_SM80 || k == K_ATTN_SM90; }

/* why a forced kernel does not take the shape (for the message) */
const char *why_not(Kern k, const Limits &lim, const Shape &s)
{
    if (!s.tc && k != K_ATTN_REF && k != K_SCORES_REF)
        return s.dqkp == 0 ? "its heads are wider than the tensor-core kernels take (Dqk, Dv <= 256)"
                           : "the tensor-core kernels take f16 and bf16 inputs only";
    if ((k == K_ATTN_SM90 || k == K_SCORES_SM90_G16 || k == K_SLC_SM90_BLK) && lim.cls != CLS_SM90)
        return "it needs a device of class sm90 (wgmma and the TMA)";
    if ((k == K_SCORES_SM80_G16 || k == K_SCORES_SM90_G16) && s.G != 16) return "it needs G = 16";
    if (k == K_SCORES_SM80_KQ && !scores_sm80_kq_takes(s.G, s.dqkp)) return "it needs G < 16 and padded Dqk <= 192";
    if (k == K_SLC_SM80_BLK && !slc_sm80_blk_takes(s.G, s.dqkp, s.dvp))
        return "it needs G <= 64 and padded dims 32/32, 64/64, 128/128 or 192/128";
    if (k == K_SLC_SM90_BLK && !slc_sm90_blk_takes(s.G, s.dqkp, s.dvp))
        return "it needs G <= 64 and padded dims 64/64, 128/128 or 192/128";
    if (k == K_SLC_SM80_G16 && !slc_sm80_g16_takes(s.G, s.cfg->slc_block, s.cfg->num_selected, s.dqkp, s.dvp))
        return "it needs G = 16, l_s <= 64, 1 <= n <= 32 and padded dims 32/32, 64/64, 128/128 or 192/128";
    return "its tiles do not fit this class's shared memory, or it has no instance for these head dims";
}

} // namespace

nsa_status choose(const Limits &lim, const nsa_config &cfg, int64_t max_ns, const Force &force, Choice *out,
                  char *msg, size_t msg_size)
{
    memset(out, 0, sizeof *out);
    Shape s = {};
    s.cfg = &cfg;
    s.G = cfg.num_kv_heads > 0 ? cfg.num_q_heads / cfg.num_kv_heads : 1;
    s.max_ns = max_ns > 0 ? max_ns : 1;
    tc_dims(cfg.head_dim_qk, cfg.head_dim_v, &s.dqkp, &s.dvp);
    s.tc = (cfg.dtype == NSA_DTYPE_F16 || cfg.dtype == NSA_DTYPE_BF16) && s.dqkp > 0;
    s.limit = lim.smem_block - SMEM_STATIC_MARGIN;
    out->dqkp = s.dqkp;
    out->dvp = s.dvp;

    /* COMPRESS: one kernel per mode */
    StageChoice &cp = out->st[NSA_STAGE_COMPRESS];
    cp.k = cfg.compress == NSA_COMPRESS_MEAN     ? K_COMPRESS_MEAN
           : cfg.compress == NSA_COMPRESS_LINEAR ? K_COMPRESS_LINEAR
                                                 : K_COMPRESS_COPY;
    if (cp.k == K_COMPRESS_LINEAR && (cfg.head_dim_qk > 1024 || cfg.head_dim_v > 1024)) {
        say(msg, msg_size, "cuda backend: LINEAR compression supports head dims up to 1024 (Dqk = %lld, Dv = %lld)",
            (long long)cfg.head_dim_qk, (long long)cfg.head_dim_v);
        return NSA_ERR_UNSUPPORTED;
    }

    const nsa_stage chosen[] = {NSA_STAGE_CMP_ATTN, NSA_STAGE_SCORES_TOPN, NSA_STAGE_SELECT_TOPN, NSA_STAGE_SLC_ATTN,
                                NSA_STAGE_WIN_ATTN};
    for (nsa_stage st : chosen) {
        StageChoice &c = out->st[st];
        const Kern fk = force.k[st];
        if (fk != K_NONE) {
            if (!takes(fk, st, lim, s, &c)) {
                say(msg, msg_size, "cuda backend: NSA_CUDA_FORCE asks stage %s to run %s, which cannot run this plan "
                                   "on class %s: %s",
                    nsa_stage_name(st), kern_name(fk), class_name(lim.cls), why_not(fk, lim, s));
                return NSA_ERR_UNSUPPORTED;
            }
            continue;
        }
        Kern pref[8];
        const int np = preference(st, pref);
        for (int i = 0; i < np; i++)
            if (takes(pref[i], st, lim, s, &c)) break;
    }
    out->st[NSA_STAGE_BLOCK_SCORES] = out->st[NSA_STAGE_SCORES_TOPN];

    /* COMBINE in the window kernel's epilogue where that kernel is a tensor-core one */
    const Kern wk = out->st[NSA_STAGE_WIN_ATTN].k;
    const bool can_fuse = cfg.window > 0 && ck_tc(wk);
    StageChoice &cb = out->st[NSA_STAGE_COMBINE];
    cb.k = force.k[NSA_STAGE_COMBINE] != K_NONE ? force.k[NSA_STAGE_COMBINE] : can_fuse ? K_COMBINE_IN_WIN : K_COMBINE;
    if (cb.k == K_COMBINE_IN_WIN && !can_fuse) {
        say(msg, msg_size, "cuda backend: NSA_CUDA_FORCE asks for combine_in_win, but the window branch is %s",
            cfg.window > 0 ? "on a reference kernel" : "off");
        return NSA_ERR_UNSUPPORTED;
    }
    /* the core's WIN_COMBINE stage (offers_win_combine) runs the window kernel */
    if (cb.k == K_COMBINE_IN_WIN) out->st[NSA_STAGE_WIN_COMBINE] = out->st[NSA_STAGE_WIN_ATTN];
    /* the core's SLC_COMBINE stage (offers_slc_combine) runs the selected kernel */
    if (cfg.num_selected > 0) out->st[NSA_STAGE_SLC_COMBINE] = out->st[NSA_STAGE_SLC_ATTN];

    /* backward (training plans): bwd_sm80's tensor-core kernels where the dtype, the dims and the class's
     * shared memory allow (every class at the padded dims it takes), with the compressed and window keys
     * kernel on wgmma on the sm90 class where its dims and tiles fit; else bwd_ref.cu's */
    const bool bwd_tc = s.tc && bwd_sm80_takes(s.dqkp, s.dvp, s.limit);
    const bool bwd_wg = bwd_tc && lim.cls == CLS_SM90 && bwd_sm90_takes(s.dqkp, s.dvp, s.limit);
    bool any_bwd_tc = false;
    const nsa_stage bwd_stages[] = {NSA_STAGE_BWD_CMP_ATTN, NSA_STAGE_BWD_SLC_ATTN, NSA_STAGE_BWD_WIN_ATTN};
    for (nsa_stage st : bwd_stages) {
        const Kern fk = force.k[st];
        if (fk == K_BWD_ATTN_SM80 && !bwd_tc) {
            say(msg, msg_size, "cuda backend: NSA_CUDA_FORCE asks stage %s to run bwd_attn_sm80, which cannot run "
                               "this plan on class %s: it takes f16 / bf16 with padded dims 32/32, 64/64, 128/128 "
                               "or 192/128 (Dqk = %lld, Dv = %lld)",
                nsa_stage_name(st), class_name(lim.cls), (long long)cfg.head_dim_qk, (long long)cfg.head_dim_v);
            return NSA_ERR_UNSUPPORTED;
        }
        if (fk == K_BWD_ATTN_SM90 && (!bwd_wg || st == NSA_STAGE_BWD_SLC_ATTN)) {
            say(msg, msg_size, "cuda backend: NSA_CUDA_FORCE asks stage %s to run bwd_attn_sm90, which cannot run "
                               "this plan on class %s: it takes the compressed and window branches on class sm90, "
                               "f16 / bf16 with padded dims 64/64, 128/128 or 192/128 (Dqk = %lld, Dv = %lld)",
                nsa_stage_name(st), class_name(lim.cls), (long long)cfg.head_dim_qk, (long long)cfg.head_dim_v);
            return NSA_ERR_UNSUPPORTED;
        }
        const Kern tc = bwd_wg && st != NSA_STAGE_BWD_SLC_ATTN ? K_BWD_ATTN_SM90 : K_BWD_ATTN_SM80;
        out->st[st].k = fk != K_NONE ? fk : bwd_tc ? tc : K_BWD_ATTN_REF;
        out->st[st].bwd_rows = st == NSA_STAGE_BWD_SLC_ATTN ? bwd_slc_rows(s.G) : BWD_ROWS_BM;
        any_bwd_tc = any_bwd_tc || out->st[st].k == K_BWD_ATTN_SM80 || out->st[st].k == K_BWD_ATTN_SM90;
    }
    out->bwd_tiles = (cfg.flags & NSA_CONFIG_TRAINING) && any_bwd_tc;
    out->st[NSA_STAGE_BWD_COMPRESS].k =
        cfg.compress == NSA_COMPRESS_LINEAR ? K_BWD_COMPRESS_LINEAR : K_BWD_COMPRESS_MEAN;
    out->st[NSA_STAGE_BWD_STORE].k = K_BWD_STORE;

    StageChoice tmp;
    out->slc_unaligned = takes(K_SLC_SM80, NSA_STAGE_SLC_ATTN, lim, s, &tmp) ? K_SLC_SM80 : K_ATTN_REF;
    out->slc_blk = cfg.num_selected > 0 && (out->st[NSA_STAGE_SLC_ATTN].k == K_SLC_SM80_BLK ||
                                            out->st[NSA_STAGE_SLC_ATTN].k == K_SLC_SM90_BLK);

    const StageChoice &sc = out->st[NSA_STAGE_SCORES_TOPN];
    const bool sc_tc = cfg.num_selected > 0 && sc.k != K_SCORES_REF;
    out->fused_topn = sc_tc && sc.rows_smem;
    if (sc_tc && sc.k == K_SCORES_SM80_KQ && scores_kq_tokens(s.G) != tile_tokens(s.G))
        out->sc_tokens = scores_kq_tokens(s.G);
    const bool cmp_tc = ck_tc(out->st[NSA_STAGE_CMP_ATTN].k);
    out->kc16 = cmp_tc || sc_tc || out->bwd_tiles;
    out->tiles = out->kc16 || (cfg.window > 0 && ck_tc(wk));
    return NSA_SUCCESS;
}

bool offers_scores_topn(const Limits &lim, const nsa_config &cfg, const Force &force)
{
    Choice c;
    char msg[8];
    /* the scores kernel does not depend on the row length except through the
     * sm90 kernel's fit, and any tensor-core kernel runs the stage */
    if (choose(lim, cfg, 1, force, &c, msg, sizeof msg) != NSA_SUCCESS) return false;
    return c.st[NSA_STAGE_SCORES_TOPN].k != K_SCORES_REF && c.st[NSA_STAGE_SCORES_TOPN].k != K_NONE;
}

bool offers_win_combine(const Limits &lim, const nsa_config &cfg, const Force &force)
{
    Choice c;
    char msg[8];
    /* the window kernel and the fusion depend on the class, dims and dtype, not on the row lengths */
    if (cfg.window <= 0 || choose(lim, cfg, 1, force, &c, msg, sizeof msg) != NSA_SUCCESS) return false;
    return c.st[NSA_STAGE_COMBINE].k == K_COMBINE_IN_WIN;
}

bool offers_slc_combine(const Limits &lim, const nsa_config &cfg, const Force &force, int mode)
{
    /* every selected kernel (and the reference) stores through slc_store; the combine
     * kernel forced (NSA_CUDA_FORCE=combine:combine, or ref) keeps the plain stages */
    if (cfg.num_selected <= 0 || force.k[NSA_STAGE_COMBINE] == K_COMBINE || mode == 0) return false;
    if (mode == 1) return true;
    /* auto: not over slc_sm80_g16, whose epilogue then waits on o_cmp's loads (1 CTA / SM):
     * H100, 64k, paper shape D 128, 38.0 -> 42.5 ms; slc_sm80_blk gains (28 / 4: 29.3 -> 29.0 ms) */
    Choice c;
    char msg[8];
    if (choose(lim, cfg, 1, force, &c, msg, sizeof msg) != NSA_SUCCESS) return false;
    return c.st[NSA_STAGE_SLC_ATTN].k != K_SLC_SM80_G16;
}

void describe(const StageChoice &c, nsa_stage stage, char *buf, size_t size)
{
    const char *n = kern_name(c.k);
    switch (c.k) {
    case K_ATTN_SM80:
        snprintf(buf, size, "%s[bn%d,%dcta%s%s]", n, c.attn.bn, c.attn.minb, c.attn.qreg ? ",qreg" : "",
                 c.attn.rw > 1 ? ",r32" : "");
        break;
    case K_ATTN_SM90: snprintf(buf, size, "%s[bn%d,%dcta,tma]", n, c.attn.bn, c.attn.minb); break;
    case K_SCORES_SM80:
    case K_SCORES_SM80_G16:
    case K_SCORES_SM80_KQ:
    case K_SCORES_SM90_G16:
        snprintf(buf, size, "%s[bn%d,%dbuf,rows:%s]%s", n, c.scores.bn, c.scores.nb,
                 c.scores.ring ? "ring" : c.rows_smem ? "smem" : "global",
                 stage == NSA_STAGE_SCORES_TOPN ? (c.rows_smem ? "+topn:fused" : "+topn") : "");
        break;
    case K_SCORES_REF:
        snprintf(buf, size, "%s%s", n, stage == NSA_STAGE_SCORES_TOPN ? "+topn" : "");
        break;
    case K_SLC_SM80_G16: snprintf(buf, size, "%s[%s,%dbuf]", n, c.slc.panel ? "panels" : "rows", c.slc.ns); break;
    case K_SLC_SM80_BLK:
    case K_SLC_SM90_BLK: snprintf(buf, size, "%s[rows%d,bn%d]", n, SBK_BM, SBK_KB); break;
    case K_BWD_ATTN_SM80:
        snprintf(buf, size, "%s[rows%d,bn%d,keys%dx%d]", n, c.bwd_rows,
                 stage == NSA_STAGE_BWD_SLC_ATTN ? BWD_SLC_KC : BWD_ROWS_BN, BWD_KEYS_BN, BWD_KEYS_BM);
        break;
    case K_BWD_ATTN_SM90: snprintf(buf, size, "%s[rows%d,bn%d,keys%d:wgmma]", n, BWD_ROWS_BM, BWD_ROWS_BN, BWD_KEYS_BN); break;
    default: snprintf(buf, size, "%s", n); break;
    }
}

} // namespace nsa_cuda
