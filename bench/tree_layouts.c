/* bench/tree_layouts.c: layouts of the TorchRL prioritized sampler's float64 sum and min trees,
 * measured for the C draw and update (issue 35, "The 10x targets, re-examined" in
 * docs/compat/torchrl.md). Not part of the package.
 *
 *   gcc -O2 -fwrapv -o /tmp/tree_layouts bench/tree_layouts.c -lm
 *   /tmp/tree_layouts L EVICT_MB ITERS GAP_NS     e.g. /tmp/tree_layouts 20 4 1500 20000
 *
 * A tree of 2^L leaves (L even, 12..26: the blocked layouts assume an even L) filled with random values; per
 * iteration: EVICT_MB of other memory touched (0: none; 4: the L2; 64: the L3 too), 256 fresh
 * random masses drawn (the level-by-level branch-free descent of _native.c's per_draw), GAP_NS of
 * CPU work (the Python between a sample and its update), then the 256 drawn leaves updated in both
 * trees (per_update). Medians of the per-iteration CPU time (CLOCK_THREAD_CPUTIME_ID). Layouts:
 *   flat         two arrays, node i at [i] (children 2i, 2i + 1): _native.c before 2026-11-29 07:00
 *   flat-inter   one array, node i's sum at [2i], min at [2i + 1] (trees.paired: _native.c now)
 *   blk2         a 4-ary heap of 64-byte blocks, each an anchor's 2 children and 4 grandchildren
 *                (2 levels of the same binary tree per cache line), sum and min in two arrays
 *   blk2-paired  the same, each block's sum line followed by its min line
 *   flat+pfmin   flat, the draw then prefetching the min tree's paths of the drawn leaves
 * Every layout draws the same leaves as flat for every mass, bit for bit (checked: MISMATCH).
 * Arrays 2 MB aligned, madvise(MADV_HUGEPAGE), as NumPy's large arrays.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <sys/mman.h>
#define M 256
static inline double sel(double x, int r) { uint64_t b; memcpy(&b, &x, 8); b &= (uint64_t)0 - (uint64_t)r; double s; memcpy(&s, &b, 8); return s; }
/* ---- flat (production) ---- */
static void f_draw(const double *tree, int64_t base, const double *masses, int64_t *index) {
  double total = tree[1], below = nextafter(total, 0.0); double t[M]; int64_t node[M];
  for (int j = 0; j < M; j++) { double v = masses[j]; t[j] = v < below ? v : below; node[j] = 1; }
  for (int64_t b = base; b > 1; b >>= 1)
    for (int j = 0; j < M; j++) { int64_t left = node[j] << 1; double ls = tree[left];
      int right = (t[j] >= ls) & (tree[left + 1] > 0.0); t[j] -= sel(ls, right); node[j] = left + right;
      if (b > 2) __builtin_prefetch(tree + (node[j] << 1)); }
  for (int j = 0; j < M; j++) index[j] = node[j] - base;
}
static void f_update(double *sum, double *mn, int64_t base, const int64_t *leaves, const double *vals, int m) {
  int64_t idx[4096];
  for (int j = 0; j < m; j++) { idx[j] = leaves[j] + base; sum[idx[j]] = vals[j]; mn[idx[j]] = vals[j]; }
  for (int64_t b = base; b > 1; b >>= 1)
    for (int j = 0; j < m; j++) { int64_t i = idx[j] >> 1; idx[j] = i;
      if (b > 2) { __builtin_prefetch(sum + (i >> 1), 1); __builtin_prefetch(mn + (i >> 1), 1); }
      sum[i] = sum[2*i] + sum[2*i+1]; double l = mn[2*i], r = mn[2*i+1]; mn[i] = l < r ? l : r; }
}
/* ---- flat interleaved: node i sum at 2i, min at 2i+1 ---- */
static void i_draw(const double *tree, int64_t base, const double *masses, int64_t *index) {
  double total = tree[2], below = nextafter(total, 0.0); double t[M]; int64_t node[M];
  for (int j = 0; j < M; j++) { double v = masses[j]; t[j] = v < below ? v : below; node[j] = 1; }
  for (int64_t b = base; b > 1; b >>= 1)
    for (int j = 0; j < M; j++) { int64_t left = node[j] << 1; double ls = tree[2*left];
      int right = (t[j] >= ls) & (tree[2*left + 2] > 0.0); t[j] -= sel(ls, right); node[j] = left + right;
      if (b > 2) __builtin_prefetch(tree + (node[j] << 2)); }
  for (int j = 0; j < M; j++) index[j] = node[j] - base;
}
static void i_update(double *tr, int64_t base, const int64_t *leaves, const double *vals, int m) {
  int64_t idx[4096];
  for (int j = 0; j < m; j++) { idx[j] = leaves[j] + base; tr[2*idx[j]] = vals[j]; tr[2*idx[j]+1] = vals[j]; }
  for (int64_t b = base; b > 1; b >>= 1)
    for (int j = 0; j < m; j++) { int64_t i = idx[j] >> 1; idx[j] = i;
      if (b > 2) __builtin_prefetch(tr + 2 * (i >> 1), 1);
      const double *c = tr + 4 * i; tr[2*i] = c[0] + c[2]; tr[2*i+1] = c[1] < c[3] ? c[1] : c[3]; }
}
/* ---- blk2: 4-ary heap of 8-double blocks (L even): slots 0,1 the anchor's children, 2..5 its grandchildren;
 * block k's child blocks 4k+1..4k+4 (anchors: the grandchildren); root in R[0]. ST = 8 (sum only) or 16 (sum line, min line) */
static void b_draw(const double *B, double root, int L, const double *masses, int64_t *index, int ST) {
  double below = nextafter(root, 0.0); double t[M]; int64_t blk[M]; int rr[M];
  for (int j = 0; j < M; j++) { double v = masses[j]; t[j] = v < below ? v : below; blk[j] = 0; }
  int64_t first = 0;
  for (int lv = 0; lv < L / 2; lv++) {
    for (int j = 0; j < M; j++) { const double *p = B + blk[j] * ST;
      double ls = p[0]; int r = (t[j] >= ls) & (p[1] > 0.0); t[j] -= sel(ls, r); rr[j] = r; }
    for (int j = 0; j < M; j++) { const double *g = B + blk[j] * ST + 2 + 2 * rr[j];
      double gs = g[0]; int r2 = (t[j] >= gs) & (g[1] > 0.0); t[j] -= sel(gs, r2);
      blk[j] = 4 * blk[j] + 1 + 2 * rr[j] + r2;
      if (lv < L / 2 - 1) __builtin_prefetch(B + blk[j] * ST); }
    first = 4 * first + 1;
  }
  for (int j = 0; j < M; j++) index[j] = blk[j] - first;
}
static void b_update(double *S, double *N, double *root, int L, const int64_t *leaves, const double *vals, int m, int ST) {
  /* leaf i: in bottom block q = first + (i >> 2), slot 2 + (i & 3) */
  int64_t first = 0; for (int lv = 0; lv < L / 2 - 1; lv++) first = 4 * first + 1;
  int64_t blk[4096]; int slot[4096];
  for (int j = 0; j < m; j++) { blk[j] = first + (leaves[j] >> 2); slot[j] = leaves[j] & 3;
    double *p = S + blk[j] * ST + 2 + slot[j]; p[0] = vals[j]; (N + blk[j] * ST + 2 + slot[j])[0] = vals[j]; }
  for (int lv = L / 2 - 1; lv >= 0; lv--) {
    for (int j = 0; j < m; j++) { int64_t k = blk[j]; int c = slot[j] >> 1; double *s = S + k * ST, *n = N + k * ST;
      int64_t up = (k - 1) >> 2; if (k > 0) { __builtin_prefetch(S + up * ST, 1); if (N != S + 8) __builtin_prefetch(N + up * ST, 1); }
      s[c] = s[2 + 2*c] + s[3 + 2*c]; double a = n[2 + 2*c], b = n[3 + 2*c]; n[c] = a < b ? a : b;
      double tot = s[0] + s[1]; a = n[0]; b = n[1]; double mi = a < b ? a : b;
      if (k == 0) { root[0] = tot; root[1] = mi; slot[j] = 0; }
      else { int q = (int)((k - 1) & 3); (S + up * ST)[2 + q] = tot; (N + up * ST)[2 + q] = mi; blk[j] = up; slot[j] = q; } }
  }
}
static double *alloc_tree(int64_t n) { size_t bytes = ((n * 8 + (2<<20) - 1) >> 21) << 21;
  double *p = aligned_alloc(2 << 20, bytes); madvise(p, bytes, MADV_HUGEPAGE); memset(p, 0, bytes); return p; }
static double now(void) { struct timespec ts; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); return ts.tv_sec * 1e9 + ts.tv_nsec; }
static uint64_t rs; static double urand(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (rs >> 11) * 0x1.0p-53; }
static int cmpd(const void *a, const void *b) { double x = *(double*)a, y = *(double*)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
  if (argc < 5) { fprintf(stderr, "usage: %s L EVICT_MB ITERS GAP_NS\n", argv[0]); return 2; }
  int L = atoi(argv[1]); if (L % 2 || L < 12 || L > 26) { fprintf(stderr, "L: even, 12..26\n"); return 2; } int64_t evict = atoll(argv[2]) << 20; int iters = atoi(argv[3]); int64_t base = (int64_t)1 << L;
  char *scratch = evict ? (char *)alloc_tree(evict / 8) : NULL; int64_t *ref = malloc(8 * M * (int64_t)iters);
  const char *names[5] = {"flat", "flat-inter", "blk2", "blk2-paired", "flat+pfmin"}; int gap = atoi(argv[4]); int pfl = argc > 5 ? atoi(argv[5]) : 10;
  int64_t nblk = 0, f = 1; for (int lv = 0; lv < L / 2; lv++) { nblk += f; f *= 4; }
  for (int k = 0; k < 5; k++) { int kk = k; if (k == 4) k = 0;
    double *A = NULL, *Bm = NULL, root[2]; int ST = k == 3 ? 16 : 8; int64_t len;
    if (k == 0) { len = 2 * base; A = alloc_tree(len); Bm = alloc_tree(len); for (int64_t i = 0; i < len; i++) Bm[i] = INFINITY; }
    else if (k == 1) { len = 4 * base; A = alloc_tree(len); for (int64_t i = 1; i < len; i += 2) A[i] = INFINITY; }
    else { len = nblk * ST; A = alloc_tree(len); if (k == 2) { Bm = alloc_tree(len); for (int64_t i = 0; i < len; i++) Bm[i] = INFINITY; } else { Bm = A + 8; for (int64_t i = 0; i < len; i++) if (i % 16 >= 8) A[i] = INFINITY; } }
    rs = 12345; int64_t lv[4096]; double vv[4096];
    for (int64_t s = 0; s < base; s += 4096) { for (int j = 0; j < 4096; j++) { lv[j] = s + j; vv[j] = urand(); }
      if (k == 0) f_update(A, Bm, base, lv, vv, 4096); else if (k == 1) i_update(A, base, lv, vv, 4096); else b_update(A, Bm, root, L, lv, vv, 4096, ST); }
    double *td = malloc(8 * iters), *tu = malloc(8 * iters), masses[M], vals[M]; int64_t idx[M]; rs = 999; double chk = 0;
    for (int it = 0; it < iters; it++) {
      if (evict) for (int64_t b = 0; b < evict; b += 64) scratch[b]++;
      double total = k == 0 ? A[1] : k == 1 ? A[2] : root[0];
      for (int j = 0; j < M; j++) masses[j] = urand() * total;
      double t0 = now();
      if (k == 0) { f_draw(A, base, masses, idx); if (kk == 4) for (int j = 0; j < M; j++) { int64_t i = idx[j] + base; for (int e = L; e > pfl; e--) { __builtin_prefetch(Bm + (i & ~(int64_t)1), 1); i >>= 1; } } } else if (k == 1) i_draw(A, base, masses, idx); else b_draw(A, root[0], L, masses, idx, ST);
      double t1 = now(); for (int j = 0; j < M; j++) vals[j] = urand() + 1e-3; { double g0 = now(); volatile double x = 1; while (now() - g0 < gap) x = x * 1.0000001; } double t2 = now();
      if (k == 0) f_update(A, Bm, base, idx, vals, M); else if (k == 1) i_update(A, base, idx, vals, M); else b_update(A, Bm, root, L, idx, vals, M, ST);
      double t3 = now(); td[it] = t1 - t0; tu[it] = t3 - t2;
      for (int j = 0; j < M; j++) { if (k == 0) ref[(int64_t)it * M + j] = idx[j]; else if (ref[(int64_t)it*M+j] != idx[j]) { printf("MISMATCH %s it %d j %d\n", names[k], it, j); return 1; } }
      chk += k == 0 ? A[1] + Bm[1] : k == 1 ? A[2] + A[3] : root[0] + root[1];
    }
    qsort(td, iters, 8, cmpd); qsort(tu, iters, 8, cmpd);
    printf("L=%d evict=%3lldMB %-12s draw %6.2f  update %6.2f  sum %6.2f us (p25 %5.2f/%5.2f)  mem %.1f MB chk %.17g\n", L, (long long)(evict>>20), names[kk], td[iters/2]/1e3, tu[iters/2]/1e3, (td[iters/2]+tu[iters/2])/1e3, td[iters/4]/1e3, tu[iters/4]/1e3, (len * 8.0 * (k == 0 || k == 2 ? 2 : 1)) / 1e6, chk); k = kk;
  }
  return 0;
}
