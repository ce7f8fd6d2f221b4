/* emu.cpp (dev/cuda_emu): the block scheduler, the runtime calls and the cuBLAS
 * calls of the emulation described in emu.h. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <ucontext.h>

#include <map>
#include <vector>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_runtime.h"

namespace emu {
uint3_ threadIdx_, blockIdx_;
dim3 blockDim_, gridDim_;

namespace {
const size_t STACK = 256 * 1024;
struct thr {
  ucontext_t ctx;
  uint3_ idx;
  bool done;
};
std::vector<thr> th;
std::vector<char> stacks;
ucontext_t sched;
int cur = -1, nthreads = 0, alive = 0;
std::function<void()> body;
/* block barrier */
int bar_count = 0;
unsigned bar_gen = 0;
/* named barriers (bar.sync id, n): 16 per block, as on the GPU; id 0 is __syncthreads' own */
int nb_count[16];
unsigned nb_gen[16];
/* warp exchange */
struct warp {
  int count;
  unsigned gen;
  unsigned char val[32][64]; /* one lane's published value (a shuffle's 8 bytes, an mma fragment set) */
};
std::vector<warp> warps;
/* warpgroup exchange (wgmma's rendezvous): 128 threads, 4 whole warps */
struct wgroup {
  int count;
  unsigned gen;
  unsigned char val[128][64];
};
std::vector<wgroup> wgroups;
/* one thread's wgmma operations not yet retired by a wait_group, in issue order; grp: the commit group it
 * belongs to (committed + 1 while uncommitted) */
struct wg_op {
  float *d;
  int n8, scd, areg, tb;
  float a[2][16]; /* A from registers: this thread's rows g and g + 8 of its warp's 16, read at the issue */
  uint64_t adesc, bdesc;
  unsigned grp;
};
struct wg_state {
  std::vector<wg_op> q;
  unsigned committed;
};
std::vector<wg_state> wgs;
/* mbarriers of the block being run, by shared-memory offset (emu.h mbar_init): the bulk copies recorded on the
 * current phase, performed when a thread waits on it */
struct bulk_copy {
  unsigned char *dst;
  const unsigned char *src;
  uint32_t bytes;
};
struct mbar {
  int expected, pending;
  unsigned phase;
  int64_t tx; /* transaction bytes expected by arrive.expect_tx, less those of the copies performed */
  std::vector<bulk_copy> copies;
};
std::map<uint32_t, mbar> mbars;
unsigned char *smem_base; /* 1024-byte aligned start of the dynamic shared memory */
size_t smem_size;
cudaError_t last = cudaSuccess;

/* Thread block clusters (emu.h run, cluster_sync, cluster_map): the cs blocks of a cluster run together, their
 * threads th[b n + i] switched round-robin as one block's are. The globals above (barrier counts, warps, warpgroups,
 * wgmma queues, mbarriers, smem_base) are the current block's: blk_swap exchanges them with the block state saved in
 * cl[b] when the scheduler passes to a thread of another block. Each block's shared memory stays in place
 * (cl_smem[b]), so cluster_map gives another block's bytes at the same offset. cur is the thread's index in its
 * block, cur_g in the cluster; cs 1 is the plain launch. */
struct blk_state {
  int bar_count;
  unsigned bar_gen;
  int nb_count[16];
  unsigned nb_gen[16];
  std::vector<warp> warps;
  std::vector<wgroup> wgroups;
  std::vector<wg_state> wgs;
  std::map<uint32_t, mbar> mbars;
  uint3_ bidx;
};
std::vector<blk_state> cl;
std::vector<std::vector<unsigned char>> cl_smem;
std::vector<unsigned char *> cl_base;
int cs = 1, cur_b = 0, cur_g = -1;
unsigned cl_rank_of[64]; /* %cluster_ctarank of block b of the cluster */
int clb_count = 0;       /* barrier.cluster: arrivals of the cluster's threads */
unsigned clb_gen = 0;
void blk_exchange(int b) { /* the globals <-> cl[b] */
  blk_state &s = cl[(size_t)b];
  std::swap(s.bar_count, bar_count);
  std::swap(s.bar_gen, bar_gen);
  for (int i = 0; i < 16; i++) { std::swap(s.nb_count[i], nb_count[i]); std::swap(s.nb_gen[i], nb_gen[i]); }
  s.warps.swap(warps);
  s.wgroups.swap(wgroups);
  s.wgs.swap(wgs);
  s.mbars.swap(mbars);
}
void blk_switch(int b) { /* make block b of the cluster the current one */
  if (b == cur_b) return;
  blk_exchange(cur_b); /* save the current block's state into cl[cur_b] */
  blk_exchange(b);     /* and load block b's */
  cur_b = b;
  smem_base = cl_base[(size_t)b];
  blockIdx_ = cl[(size_t)b].bidx;
}

void yield() { swapcontext(&th[cur_g].ctx, &sched); }
void entry() {
  body();
  if (!wgs[cur].q.empty()) {
    fprintf(stderr, "emu: thread %d of block (%u,%u,%u) exited with %zu wgmma operations not retired by "
            "wgmma.wait_group (their accumulators are never written)\n", cur, blockIdx_.x, blockIdx_.y, blockIdx_.z,
            wgs[cur].q.size());
    abort();
  }
  th[cur_g].done = true;
  alive--;
}
int warp_size(int w) { int n = nthreads - 32 * w; return n < 32 ? n : 32; }
}  // namespace

int lane() { return cur & 31; }
void check_aligned(const void *p, unsigned bytes, const char *what, const char *file, int line) {
  if ((uintptr_t)p % bytes) {
    fprintf(stderr, "emu: %s:%d: %s = %p is not %u-byte aligned (a vector access would fault on the GPU)\n", file,
            line, what, p, bytes);
    abort();
  }
}
void *dyn_smem() { return smem_base; }
uint32_t smem_addr(const void *p) {
  const uintptr_t o = (uintptr_t)p - (uintptr_t)smem_base;
  if ((const unsigned char *)p < smem_base || o > smem_size) {
    fprintf(stderr, "emu: shared address of %p, which is not in this launch's dynamic shared memory (%p, %zu bytes): "
            "the emulation gives shared addresses to dynamic shared memory only\n", p, (void *)smem_base, smem_size);
    abort();
  }
  return (uint32_t)o;
}

void syncthreads() {
  unsigned g = bar_gen;
  if (++bar_count == nthreads) {
    bar_count = 0;
    bar_gen++;
    return;
  }
  int spins = 0;
  while (bar_gen == g) {
    yield();
    if (++spins > 1000000) { fprintf(stderr, "emu: __syncthreads deadlock (threads exited early?)\n"); abort(); }
  }
}

/* bar.sync id, n (PTX ISA, "bar.sync"): the first n threads to arrive at barrier id go on together. A count
 * that is not a multiple of 32 (or is over the block's threads), or id outside 1..15, is a bug in the kernel. */
void bar_sync(int id, int n) {
  if (id < 1 || id > 15 || n <= 0 || n % 32 || n > nthreads) {
    fprintf(stderr, "emu: bar.sync %d, %d in a block of %d threads\n", id, n, nthreads);
    abort();
  }
  unsigned g = nb_gen[id];
  if (++nb_count[id] == n) {
    nb_count[id] = 0;
    nb_gen[id]++;
    return;
  }
  int spins = 0;
  while (nb_gen[id] == g) {
    yield();
    if (++spins > 1000000) { fprintf(stderr, "emu: bar.sync %d deadlock\n", id); abort(); }
  }
}

/* Each lane publishes its value, waits for its warp, reads src_lane's, waits again. */
static void group_barrier(int &count, unsigned &gen, int n, const char *what) {
  unsigned g = gen;
  if (++count == n) { count = 0; gen++; return; }
  int spins = 0;
  while (gen == g) {
    yield();
    if (++spins > 1000000) { fprintf(stderr, "emu: %s deadlock (diverged threads?)\n", what); abort(); }
  }
}
static void warp_barrier(warp &w, int n) { group_barrier(w.count, w.gen, n, "warp shuffle"); }
void warp_exchange(const void *v, void *out, int size, int src) {
  const int wi = cur >> 5, n = warp_size(wi);
  warp &w = warps[wi];
  memcpy(w.val[cur & 31], v, (size_t)size);
  warp_barrier(w, n);
  if (src >= n) { fprintf(stderr, "emu: shuffle from inactive lane %d\n", src); abort(); }
  memcpy(out, w.val[src], (size_t)size);
  warp_barrier(w, n);
}

/* Each lane publishes `size` bytes; every lane gets all 32 (the warp-wide mma of src/cuda/mma.cuh). */
void warp_gather(const void *v, void *all, int size) {
  const int wi = cur >> 5, n = warp_size(wi);
  warp &w = warps[wi];
  if (size > 64 || n != 32) { fprintf(stderr, "emu: warp_gather of %d bytes over %d lanes\n", size, n); abort(); }
  memcpy(w.val[cur & 31], v, (size_t)size);
  warp_barrier(w, n);
  for (int l = 0; l < 32; l++) memcpy((unsigned char *)all + (size_t)l * size, w.val[l], (size_t)size);
  warp_barrier(w, n);
}

/* Each of the warpgroup's 128 threads publishes `size` bytes; every one gets all 128 (wgmma's operands). */
void warpgroup_gather(const void *v, void *all, int size) {
  const int gi = cur >> 7;
  if (size > 64 || 128 * (gi + 1) > nthreads) {
    fprintf(stderr, "emu: warpgroup operation of %d bytes by thread %d of a block of %d threads (a warpgroup is "
            "128 threads, 4 whole warps)\n", size, cur, nthreads);
    abort();
  }
  wgroup &w = wgroups[(size_t)gi];
  memcpy(w.val[cur & 127], v, (size_t)size);
  group_barrier(w.count, w.gen, 128, "warpgroup (wgmma)");
  for (int l = 0; l < 128; l++) memcpy((unsigned char *)all + (size_t)l * size, w.val[l], (size_t)size);
  group_barrier(w.count, w.gen, 128, "warpgroup (wgmma)");
}

/* ---- wgmma (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate") ----
 * A descriptor (PTX ISA, "Matrix Descriptor"): bits 0-13 start address >> 4, 16-29 leading dimension byte offset
 * (LBO) >> 4, 32-45 stride dimension byte offset (SBO) >> 4, 49-51 base offset, 62-63 swizzle (0 none, 1 128-byte,
 * 2 64-byte, 3 32-byte). K-major operands (and B MN-major with tb: wg_elem_mn, below): element (mn, k) of a 16-bit
 * operand, in its 8 x 16-byte core matrices (8 rows of 8 k),
 *   no swizzle:  start + (mn % 8) 16 + (mn / 8) SBO + (k / 8) LBO + (k % 8) 2
 *   128-byte:    start + (mn % 8) 128 + (mn / 8) SBO + (k / 8) 16 + (k % 8) 2, then address bits 4-6 ^= bits 7-9
 *                (LBO unused: the k16 step lies inside one 128-byte row). */
static void wg_check_desc(uint64_t desc, const char *which) {
  const unsigned mode = (unsigned)(desc >> 62), base = (unsigned)(desc >> 49) & 7u;
  const uint32_t start = (uint32_t)(desc & 0x3FFFu) << 4, sbo = (uint32_t)((desc >> 32) & 0x3FFFu) << 4;
  if (base) {
    fprintf(stderr, "emu: wgmma %s descriptor %#llx: base offset %u is not emulated (0 only)\n", which,
            (unsigned long long)desc, base);
    abort();
  }
  if (mode == 2 || mode == 3) {
    fprintf(stderr, "emu: wgmma %s descriptor %#llx: %d-byte swizzle is not emulated (none and 128-byte only)\n",
            which, (unsigned long long)desc, mode == 2 ? 64 : 32);
    abort();
  }
  if (mode == 1 && ((start & 0x380u) || sbo % 1024)) {
    fprintf(stderr, "emu: wgmma %s descriptor %#llx: 128-byte swizzle with the pattern off a 1024-byte boundary "
            "(start %#x, SBO %u): not emulated (the emulation swizzles the address's own bits 7-9)\n", which,
            (unsigned long long)desc, start, sbo);
    abort();
  }
}
/* The bf16 at dynamic shared-memory byte address a, as a float; an address past the dynamic shared memory aborts
 * with the operand's element (i, j) and descriptor named. */
static float wg_smem_bf16(uint32_t a, const char *what, int i, int j, uint64_t desc) {
  if ((size_t)a + 2 > smem_size) {
    fprintf(stderr, "emu: wgmma %s element (%d, %d) at shared address %u, past the %zu bytes of dynamic shared "
            "memory (descriptor %#llx)\n", what, i, j, a, smem_size, (unsigned long long)desc);
    abort();
  }
  uint16_t h;
  memcpy(&h, smem_base + a, 2);
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static float wg_elem(uint64_t desc, int mn, int k) {
  const uint32_t start = (uint32_t)(desc & 0x3FFFu) << 4, lbo = (uint32_t)((desc >> 16) & 0x3FFFu) << 4;
  const uint32_t sbo = (uint32_t)((desc >> 32) & 0x3FFFu) << 4;
  uint32_t a;
  if ((desc >> 62) == 1) {
    a = start + (uint32_t)(mn & 7) * 128u + (uint32_t)(mn >> 3) * sbo + (uint32_t)(k >> 3) * 16u + (uint32_t)(k & 7) * 2u;
    a ^= ((a >> 7) & 7u) << 4;
  } else {
    a = start + (uint32_t)(mn & 7) * 16u + (uint32_t)(mn >> 3) * sbo + (uint32_t)(k >> 3) * lbo + (uint32_t)(k & 7) * 2u;
  }
  return wg_smem_bf16(a, "operand", mn, k, desc);
}
/* Element (n, k) of an MN-major (transposed) 16-bit B with the 128-byte swizzle (the attention lab's version 15: V
 * [keys, dims] as B = V, k = key, n = dim): the PTX ISA's canonical layout "Swizzle<3,4,3> o ((T,8,m),(8,k)):((1,T,
 * LBO),(8T,SBO))" (its "Canonical Layouts" table; T = 8 16-bit elements): rows of 128 bytes hold 64 consecutive n of
 * one k, 8 rows a 1024-byte pattern, the 8-row groups along k SBO apart, the 64-column blocks along n LBO apart; the
 * 16-byte chunk index XORed with the row in the pattern as for K-major. */
static float wg_elem_mn(uint64_t desc, int n, int k) {
  const uint32_t start = (uint32_t)(desc & 0x3FFFu) << 4, lbo = (uint32_t)((desc >> 16) & 0x3FFFu) << 4;
  const uint32_t sbo = (uint32_t)((desc >> 32) & 0x3FFFu) << 4;
  if ((desc >> 62) != 1 || lbo % 1024) {
    fprintf(stderr, "emu: wgmma MN-major B descriptor %#llx: only the 128-byte swizzle with 1024-byte multiples of LBO "
            "is emulated\n", (unsigned long long)desc);
    abort();
  }
  uint32_t a = start + (uint32_t)(k & 7) * 128u + (uint32_t)(k >> 3) * sbo + (uint32_t)(n >> 6) * lbo + (uint32_t)(n & 63) * 2u;
  a ^= ((a >> 7) & 7u) << 4;
  return wg_smem_bf16(a, "MN-major B", n, k, desc);
}
static float bf16_lo(uint32_t v) { const uint32_t u = v << 16; float f; memcpy(&f, &u, 4); return f; }
static float bf16_hi(uint32_t v) { const uint32_t u = v & 0xffff0000u; float f; memcpy(&f, &u, 4); return f; }

void wgmma_bf16(float *d, int n8, const uint32_t *a, uint64_t adesc, uint64_t bdesc, int scd, int tb) {
  struct pub {
    uint32_t a[4];
    uint64_t adesc, bdesc;
    int32_t n8, scd, areg, tb;
  } mine, all[128];
  memset(&mine, 0, sizeof mine);
  if (a) memcpy(mine.a, a, 16);
  mine.adesc = a ? 0 : adesc;
  mine.bdesc = bdesc;
  mine.n8 = n8;
  mine.scd = scd != 0;
  mine.areg = a != NULL;
  mine.tb = tb != 0;
  warpgroup_gather(&mine, all, (int)sizeof mine);
  const int wt = cur & 127, w = wt >> 5, l = wt & 31, g = l >> 2;
  for (int i = 0; i < 128; i++)
    if (all[i].adesc != mine.adesc || all[i].bdesc != mine.bdesc || all[i].n8 != mine.n8 || all[i].scd != mine.scd ||
        all[i].areg != mine.areg || all[i].tb != mine.tb) {
      fprintf(stderr, "emu: wgmma operands differ across the warpgroup (threads %d and %d of block (%u,%u,%u): "
              "descriptors, shape, scale-d or A's source; .aligned: every thread issues the same wgmma)\n",
              (cur & ~127) + i, cur, blockIdx_.x, blockIdx_.y, blockIdx_.z);
      abort();
    }
  if (n8 < 1 || n8 > 32) { fprintf(stderr, "emu: wgmma m64n%dk16: N is 8..256\n", 8 * n8); abort(); }
  if (!a) wg_check_desc(adesc, "A");
  wg_check_desc(bdesc, "B");
  wg_op op;
  op.d = d;
  op.n8 = n8;
  op.scd = scd != 0;
  op.areg = a != NULL;
  op.tb = tb != 0;
  op.adesc = adesc;
  op.bdesc = bdesc;
  wg_state &st = wgs[(size_t)cur];
  op.grp = st.committed + 1;
  if (a) { /* the mma.m16n8k16 A layout per warp: lane 4 g + t holds (row g, k 2t, 2t+1) in a0, row g + 8 in a1,
              k + 8 in a2, a3 */
    for (int t = 0; t < 4; t++) {
      const pub &f = all[32 * w + 4 * g + t];
      op.a[0][2 * t] = bf16_lo(f.a[0]); op.a[0][2 * t + 1] = bf16_hi(f.a[0]);
      op.a[1][2 * t] = bf16_lo(f.a[1]); op.a[1][2 * t + 1] = bf16_hi(f.a[1]);
      op.a[0][2 * t + 8] = bf16_lo(f.a[2]); op.a[0][2 * t + 9] = bf16_hi(f.a[2]);
      op.a[1][2 * t + 8] = bf16_lo(f.a[3]); op.a[1][2 * t + 9] = bf16_hi(f.a[3]);
    }
  }
  st.q.push_back(op);
}

void wgmma_commit() { wgs[(size_t)cur].committed++; }

/* This thread's D elements of op: d[4 j + i] = (row 16 w + g + 8 (i / 2), column 8 j + 2 t + i % 2), the sum in k
 * order from D (or 0), each product exact in fp32 (bf16 operands), each addition rounded to nearest. */
static void wg_exec(const wg_op &op) {
  const int wt = cur & 127, w = wt >> 5, l = wt & 31, g = l >> 2, t = l & 3;
  float A[2][16];
  if (op.areg) memcpy(A, op.a, sizeof A);
  else
    for (int r = 0; r < 2; r++)
      for (int k = 0; k < 16; k++) A[r][k] = wg_elem(op.adesc, 16 * w + g + 8 * r, k);
  for (int j = 0; j < op.n8; j++)
    for (int c = 0; c < 2; c++) {
      const int col = 8 * j + 2 * t + c;
      float B[16];
      for (int k = 0; k < 16; k++) B[k] = op.tb ? wg_elem_mn(op.bdesc, col, k) : wg_elem(op.bdesc, col, k);
      for (int r = 0; r < 2; r++) {
        float *o = op.d + 4 * j + 2 * r + c;
        volatile float s = op.scd ? *o : 0.0f;
        for (int k = 0; k < 16; k++) {
          volatile float p = A[r][k] * B[k]; /* exact: 8-bit significands */
          s = s + p;
        }
        *o = s;
      }
    }
}

void wgmma_wait(int n) {
  wg_state &st = wgs[(size_t)cur];
  size_t done = 0;
  for (const wg_op &op : st.q) {
    if (op.grp + (unsigned)n > st.committed) break; /* issue order: later ops are in the same or newer groups */
    wg_exec(op);
    done++;
  }
  st.q.erase(st.q.begin(), st.q.begin() + (long)done);
}

static mbar &mbar_of(void *bar, const char *what) {
  const uint32_t o = smem_addr(bar);
  auto it = mbars.find(o);
  if (o % 8 || it == mbars.end()) {
    fprintf(stderr, "emu: %s on shared offset %u of block (%u,%u,%u), which is not an initialised mbarrier "
            "(8-byte aligned, mbarrier.init first)\n", what, o, blockIdx_.x, blockIdx_.y, blockIdx_.z);
    abort();
  }
  return it->second;
}
void mbar_init(void *bar, int count) {
  const uint32_t o = smem_addr(bar);
  auto it = mbars.find(o);
  if (o % 8 || count < 1 || (it != mbars.end() && !it->second.copies.empty())) {
    fprintf(stderr, "emu: mbarrier.init at shared offset %u, count %d (8-byte aligned, count >= 1, no copy pending "
            "on it)\n", o, count);
    abort();
  }
  mbars[o] = mbar{count, count, 0, 0, {}};
  memset(bar, 0, 8);
}
/* The current phase of m (its arrivals all in) completes: its copies performed, their bytes checked against the
 * transaction count, the next phase begun. */
static void mbar_complete(mbar &m, void *bar) {
  for (const bulk_copy &c : m.copies) {
    memcpy(c.dst, c.src, c.bytes);
    m.tx -= c.bytes;
  }
  m.copies.clear();
  if (m.tx != 0) {
    fprintf(stderr, "emu: mbarrier at shared offset %u: the phase's transaction bytes are off by %lld from its "
            "copies' (arrive.expect_tx and cp.async.bulk disagree: on the GPU a hang or an early completion)\n",
            smem_addr(bar), (long long)m.tx);
    abort();
  }
  m.phase++;
  m.pending = m.expected;
}
void mbar_arrive_expect_tx(void *bar, uint32_t bytes) {
  mbar &m = mbar_of(bar, "mbarrier.arrive.expect_tx");
  if (m.pending < 1) mbar_complete(m, bar); /* the phase before, never waited for, completed by now (its copies land) */
  m.tx += bytes;
  m.pending--;
}
void bulk_g2s(void *dst, const void *src, uint32_t bytes, void *bar) {
  mbar &m = mbar_of(bar, "cp.async.bulk");
  const uint32_t d = smem_addr(dst);
  if (bytes == 0 || bytes % 16 || d % 16 || (uintptr_t)src % 16 || d + bytes > smem_size) {
    fprintf(stderr, "emu: cp.async.bulk of %u bytes from %p to shared offset %u (16-byte aligned addresses, a "
            "nonzero multiple of 16 bytes, inside the %zu bytes of dynamic shared memory)\n", bytes, src, d, smem_size);
    abort();
  }
  m.copies.push_back(bulk_copy{(unsigned char *)dst, (const unsigned char *)src, bytes});
}
bool mbar_try_wait_parity(void *bar, uint32_t parity) {
  mbar &m = mbar_of(bar, "mbarrier.try_wait.parity");
  if ((m.phase & 1u) != (parity & 1u)) return true; /* the phase of that parity completed (the one before) */
  if (m.pending > 0) return false;                  /* arrivals still to come: the caller spins (yields) */
  mbar_complete(m, bar);
  return true;
}
/* The wait loop of dg_mbar_wait: a false try_wait yields to the other threads (they may still arrive). */
void mbar_wait_parity(void *bar, uint32_t parity) {
  int spins = 0;
  while (!mbar_try_wait_parity(bar, parity)) {
    yield();
    if (++spins > 1000000) {
      fprintf(stderr, "emu: mbarrier wait at shared offset %u, parity %u: deadlock (no thread arrives)\n",
              smem_addr(bar), parity);
      abort();
    }
  }
}

void run(dim3 grid, dim3 block, size_t sm, std::function<void()> fn) { run_cluster(grid, block, sm, fn, dim3(1, 1, 1)); }
void run_cluster(dim3 grid, dim3 block, size_t sm, std::function<void()> fn, dim3 cdim) {
  const int n = (int)(block.x * block.y * block.z);
  const int ncl = (int)(cdim.x * cdim.y * cdim.z);
  if (n <= 0 || n > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 ||
      sm > 227 * 1024 || ncl < 1 || ncl > 16 || grid.x % cdim.x || grid.y % cdim.y || grid.z % cdim.z ||
      (ncl > 1 && n % 128)) {
    fprintf(stderr, "emu: bad launch grid (%u,%u,%u) block (%u,%u,%u) smem %zu cluster (%u,%u,%u) (a cluster: at "
            "most 16 blocks dividing the grid; here whole warpgroups per block)\n", grid.x, grid.y, grid.z, block.x,
            block.y, block.z, sm, cdim.x, cdim.y, cdim.z);
    last = cudaErrorInvalidConfiguration;
    return;
  }
  if ((int)th.size() < n * ncl) {
    th.resize((size_t)n * ncl);
    stacks.assign((size_t)n * ncl * STACK, 0);
  }
  cs = ncl;
  cl.assign((size_t)ncl, blk_state{});
  cl_smem.assign((size_t)ncl, std::vector<unsigned char>());
  cl_base.assign((size_t)ncl, nullptr);
  for (int b = 0; b < ncl; b++) { /* filled once per launch, as before clusters: a block sees the shared bytes the
                                     block before it left */
    cl_smem[(size_t)b].assign(sm + 16 + 1024, 0xFF); /* uninitialised: NaN */
    unsigned char *d = cl_smem[(size_t)b].data();
    cl_base[(size_t)b] = d + (1024 - (uintptr_t)d % 1024) % 1024;
    cl[(size_t)b].warps.assign((size_t)(n + 31) / 32, warp{0, 0, {}});
    cl[(size_t)b].wgroups.assign((size_t)(n + 127) / 128, wgroup{0, 0, {}});
    cl[(size_t)b].wgs.assign((size_t)n, wg_state{{}, 0});
  }
  smem_size = sm;
  blockDim_ = block;
  gridDim_ = grid;
  body = fn;
  nthreads = n;
  for (unsigned cz = 0; cz < grid.z; cz += cdim.z)
    for (unsigned cy = 0; cy < grid.y; cy += cdim.y)
      for (unsigned cx = 0; cx < grid.x; cx += cdim.x) {
        /* the cluster's blocks, rank x fastest (%cluster_ctarank), each with a fresh state */
        for (int b = 0; b < ncl; b++) {
          blk_state &s = cl[(size_t)b];
          const unsigned rx = (unsigned)b % cdim.x, ry = ((unsigned)b / cdim.x) % cdim.y,
                         rz = (unsigned)b / (cdim.x * cdim.y);
          s.bidx = uint3_{cx + rx, cy + ry, cz + rz};
          cl_rank_of[b] = (unsigned)b;
          s.bar_count = 0;
          for (int i = 0; i < 16; i++) s.nb_count[i] = 0;
          for (auto &w : s.warps) w.count = 0;
          for (auto &w : s.wgroups) w.count = 0;
          for (auto &q : s.wgs) { q.q.clear(); q.committed = 0; }
          s.mbars.clear();
        }
        /* block 0 current: its state in the globals */
        cur_b = 0;
        blk_exchange(0);
        smem_base = cl_base[0];
        blockIdx_ = cl[0].bidx;
        clb_count = 0;
        for (int i = 0; i < n * ncl; i++) {
          getcontext(&th[i].ctx);
          th[i].ctx.uc_stack.ss_sp = stacks.data() + (size_t)i * STACK;
          th[i].ctx.uc_stack.ss_size = STACK;
          th[i].ctx.uc_link = &sched;
          makecontext(&th[i].ctx, entry, 0);
          const int li = i % n;
          th[i].idx = uint3_{(unsigned)(li % block.x), (unsigned)((li / block.x) % block.y),
                             (unsigned)(li / (block.x * block.y))};
          th[i].done = false;
        }
        alive = n * ncl;
        while (alive > 0)
          for (int i = 0; i < n * ncl; i++) {
            if (th[i].done) continue;
            blk_switch(i / n);
            cur = i % n;
            cur_g = i;
            threadIdx_ = th[i].idx;
            swapcontext(&sched, &th[i].ctx);
          }
        blk_switch(0);
        blk_exchange(0); /* the globals back into cl[0]: every block's state in cl */
        for (int b = 0; b < ncl; b++)
          for (const auto &m : cl[(size_t)b].mbars)
            if (!m.second.copies.empty()) {
              const uint3_ &bi = cl[(size_t)b].bidx;
              fprintf(stderr, "emu: block (%u,%u,%u) exited with %zu cp.async.bulk copies on the mbarrier at shared "
                      "offset %u never waited for\n", bi.x, bi.y, bi.z, m.second.copies.size(), m.first);
              abort();
            }
      }
  cur = -1;
  cur_g = -1;
  cs = 1;
}

unsigned cluster_rank() { return cl_rank_of[cur_b]; }
unsigned cluster_size() { return (unsigned)cs; }
/* barrier.cluster.arrive + wait: every thread of every block of the cluster arrives before any goes on (memory is
 * shared, so that orders it too). */
void cluster_sync() {
  const unsigned g = clb_gen;
  if (++clb_count == nthreads * cs) {
    clb_count = 0;
    clb_gen++;
    return;
  }
  int spins = 0;
  while (clb_gen == g) {
    yield();
    if (++spins > 1000000) { fprintf(stderr, "emu: barrier.cluster deadlock (threads exited early?)\n"); abort(); }
  }
}
/* mapa: the address of the byte at p's offset in the dynamic shared memory of block `rank` of the cluster */
void *cluster_map(const void *p, unsigned rank) {
  const uint32_t o = smem_addr(p);
  if (rank >= (unsigned)cs) {
    fprintf(stderr, "emu: mapa to rank %u of a cluster of %d blocks\n", rank, cs);
    abort();
  }
  return cl_base[rank] + o;
}
}  // namespace emu

/* ---- runtime ---- */
static int emu_fail_malloc_above = -1;
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "dgemma CPU emulation of CUDA (dev/cuda_emu)");
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 1;
  p->totalGlobalMem = (size_t)64 << 30;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetDevice(int *dev) { *dev = 0; return cudaSuccess; }
/* the emulated device reports the H200's 132 multiprocessors (the kernels' split counts follow) */
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr, int) { *v = 132; return cudaSuccess; }
cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot) { *fr = *tot = (size_t)64 << 30; return cudaSuccess; }
cudaError_t cudaDriverGetVersion(int *v) { *v = 13000; return cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int *v) { *v = 13000; return cudaSuccess; }
cudaError_t cudaMalloc(void **p, size_t n) {
  (void)emu_fail_malloc_above;
  *p = malloc(n);
  if (!*p) return cudaErrorMemoryAllocation;
  memset(*p, 0xFF, n); /* uninitialised device memory reads as NaN */
  return cudaSuccess;
}
cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMallocHost(void **p, size_t n) { *p = malloc(n); return *p ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaFreeHost(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) { memmove(d, s, n); return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t) {
  memmove(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemset(void *d, int v, size_t n) { memset(d, v, n); return cudaSuccess; }
cudaError_t cudaMemset2DAsync(void *d, size_t pitch, int v, size_t width, size_t height, cudaStream_t) {
  if (width > pitch) return cudaErrorInvalidValue; /* as the runtime: a row may not overlap the next */
  for (size_t r = 0; r < height; r++) memset((char *)d + r * pitch, v, width);
  return cudaSuccess;
}
struct emu_event { double t; };
cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = (cudaEvent_t)calloc(1, sizeof(emu_event)); return *e ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  if (!e) return cudaErrorInvalidValue;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  e->t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return e ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  if (!a || !b) return cudaErrorInvalidValue;
  *ms = (float)(1e3 * (b->t - a->t));
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) { *s = (cudaStream_t)malloc(1); return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) { return e ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaStreamDestroy(cudaStream_t s) { free(s); return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaGetLastError(void) { cudaError_t e = emu::last; emu::last = cudaSuccess; return e; }
const char *cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : e == cudaErrorLaunchFailure ? "unspecified launch failure (emulated)" : "emulated CUDA error";
}
const char *cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated"; }

/* ---- cuBLAS ---- */
cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = (cublasHandle_t)malloc(1); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasDestroy(cublasHandle_t h) { free(h); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
const char *cublasGetStatusString(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? "success" : "emulated cuBLAS error"; }

static float elem(const void *p, cudaDataType t, size_t i) {
  if (t == CUDA_R_16BF) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  return ((const float *)p)[i];
}

static cublasStatus_t gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void *A,
                           cudaDataType at, int lda, const void *B, cudaDataType bt, int ldb, float beta, void *C,
                           cudaDataType ct, int ldc) {
  if (ct != CUDA_R_32F || m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m) return CUBLAS_STATUS_INVALID_VALUE;
  float *c = (float *)C;
  std::vector<float> a((size_t)k);
#pragma omp parallel for firstprivate(a) schedule(static)
  for (int i = 0; i < m; i++) {
    a.resize((size_t)k);
    for (int l = 0; l < k; l++) a[(size_t)l] = elem(A, at, ta == CUBLAS_OP_N ? (size_t)i + (size_t)l * lda : (size_t)l + (size_t)i * lda);
    for (int j = 0; j < n; j++) {
      float s = 0.0f;
      for (int l = 0; l < k; l++)
        s += a[(size_t)l] * elem(B, bt, tb == CUBLAS_OP_N ? (size_t)l + (size_t)j * ldb : (size_t)j + (size_t)l * ldb);
      float *o = c + (size_t)i + (size_t)j * ldc;
      *o = alpha * s + (beta != 0.0f ? beta * *o : 0.0f);
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                            int ldb, const void *beta, void *C, cudaDataType ct, int ldc, cublasComputeType_t,
                            cublasGemmAlgo_t) {
  return gemm(ta, tb, m, n, k, *(const float *)alpha, A, at, lda, B, bt, ldb, *(const float *)beta, C, ct, ldc);
}
cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc) {
  return gemm(ta, tb, m, n, k, *alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, *beta, C, CUDA_R_32F, ldc);
}
