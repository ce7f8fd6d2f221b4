/* fg_sim.cpp: the slot model of lab version 114/116-118's one launch (gate/up and down of the 26B's experts, work
 * tickets in order, a down block waiting for its expert's gate/up blocks) as a list schedule on the CPU, printed by
 * the lab's own timeline printout (fg_timeline.h), so that a GPU timeline of version 116 can be read line by line
 * against what the model assumed (docs/cuda.md "Session 27 (helper tl11)"). The model: S slots (528 on the H100:
 * 132 SMs x 4 blocks); a slot that frees takes the next ticket at once; a block's phases are fixed lengths (session
 * 25's H100 medians at uniform M 16: gate/up rows 1.9, act0 1.2, w0 0.9, loop 34.4, epi 1.1 us; down rows 1.5,
 * act0 1.0, w0 1.0, loop 6.9, epi 1.3 us) plus a ticket of TICKET us before them, whatever runs beside it (the
 * premise that a block streams at the same rate whether or not other slots are busy); a down block runs its phases
 * once its expert's gate/up blocks have all ended. All experts have rows (uniform: 16 each, one pass).
 * Build and run (any C++17 compiler, no GPU):
 *   g++ -O2 -std=c++17 -Idev/cuda dev/cuda/fg_sim.cpp -o /tmp/fg_sim && /tmp/fg_sim [--slots 528] [--ticket 0.7]
 *       [--ia N --ik K] [--gu-loop 34.4] [--dn-loop 6.9] [--gu-dF -1.0] [--dn-dF -0.8]
 * --gu-dF / --dn-dF (session 28, helper pf11): us added to every gate/up / down block's phases outside the loop (taken
 * off its row-table phase, negative: lab versions 125-126 hiding part of F, docs/cuda.md "Session 28 (helper pf11)");
 * --ticket 0 models version 119's persistent blocks (the next ticket taken during the item).
 * Prints the modelled span and the timeline lines of version 116's printout. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <queue>
#include <vector>

static double quant(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, (size_t)(q * (v.size() - 1) + 0.5))];
}
#include "fg_timeline.h"

/* qr_fgx_map (dev/cuda/qr_diet_lab.cuh), the same arithmetic */
static void fgx_map(int tk, int G, int ia, int ik, int *gi, int *di) {
  if (tk < ia) { *gi = tk; *di = -1; return; }
  const int rg = G - ia, u = tk - ia;
  if (u < rg * (ik + 1)) {
    const int q = u / (ik + 1), r = u % (ik + 1);
    *gi = r == 0 ? ia + q : -1;
    *di = r == 0 ? -1 : q * ik + r - 1;
    return;
  }
  *gi = -1;
  *di = rg * ik + (u - rg * (ik + 1));
}

int main(int argc, char **argv) {
  int S = 528, E = 128, ngu = 11, ndn = 22, ia = -1, ik = 0;
  double ticket = 0.7, gul = 34.4, dnl = 6.9, gudf = 0, dndf = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--slots")) S = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--ticket")) ticket = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--ia")) ia = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--ik")) ik = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--gu-loop")) gul = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--dn-loop")) dnl = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--gu-dF")) gudf = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--dn-dF")) dndf = atof(argv[i + 1]);
    else { fprintf(stderr, "fg_sim: unknown option %s\n", argv[i]); return 2; }
  }
  const int G = E * ngu, N = G + E * ndn;
  if (ia < 0) ia = G;
  const double ph[2][5] = {{1.9 + gudf, 1.2, 0.9, gul, 1.1}, {1.5 + dndf, 1.0, 1.0, dnl, 1.3}}; /* rows act0 w0 loop epi, us */
  const double GHZ = 1.755;                                                        /* clock64 per ns */
  std::vector<uint64_t> w((size_t)N * FG_TL_WORDS, 0);
  std::vector<double> gudone(E, 0);
  std::vector<int> gucount(E, 0);
  /* slots free at times (us); the next ticket goes to the earliest */
  std::priority_queue<double, std::vector<double>, std::greater<double>> slots;
  for (int s = 0; s < S; s++) slots.push(0.0);
  /* the down blocks that wait need their expert's gate/up ends: tickets are taken in order and a gate/up block's
   * end is known when it is placed, so a down block's wait ends at max(its ticket, gudone[e]) once every gate/up
   * block of e has been placed (always true for a down ticket: its gate/up tickets are lower) */
  double end = 0;
  for (int tk = 0; tk < N; tk++) {
    const double t0 = slots.top();
    slots.pop();
    int gi, di;
    fgx_map(tk, G, ia, ik, &gi, &di);
    const int prod = gi >= 0 ? 0 : 1, e = prod ? di / ndn : gi / ngu, slab = prod ? di % ndn : gi % ngu;
    uint64_t *b = &w[(size_t)tk * FG_TL_WORDS];
    const double tt = t0 + ticket; /* the ticket shared */
    double run = tt;
    if (prod) {
      if (gucount[e] < ngu) { fprintf(stderr, "fg_sim: ticket %d: a down item before its gate/up items\n", tk); return 1; }
      run = std::max(tt, gudone[e]);
    }
    double t = run, c[5];
    for (int k = 0; k < 5; k++) c[k] = (t += ph[prod][k]);
    b[0] = (uint64_t)(t0 * 1e3);
    b[1] = (uint64_t)(t * 1e3);
    b[2] = (uint64_t)(t0 * 1e3 * GHZ);
    b[10] = (uint64_t)(tt * 1e3 * GHZ);
    b[11] = (uint64_t)(tt * 1e3);
    /* the clock stamps: rows ready counts from the wait's end (down) */
    for (int k = 0; k < 5; k++) b[3 + k] = (uint64_t)(c[k] * 1e3 * GHZ);
    b[8] = (uint64_t)(tk % 132);
    b[9] = (uint64_t)e << 32 | 16u;
    b[12] = (uint64_t)((prod ? run : t) * 1e3);
    b[13] = (uint64_t)prod << 32 | (uint32_t)slab;
    if (!prod) {
      gudone[e] = std::max(gudone[e], t);
      gucount[e]++;
    }
    end = std::max(end, t);
    slots.push(t);
  }
  const double gub = ticket + ph[0][0] + ph[0][1] + ph[0][2] + gul + ph[0][4];
  const double dnb = ticket + ph[1][0] + ph[1][1] + ph[1][2] + dnl + ph[1][4];
  printf("fg_sim: %d slots, ticket %.2f us, gate/up block %.1f us (loop %.1f), down block %.1f us (loop %.1f), order "
         "ia %d ik %d: span %.1f us (slot-us %.0f / slots = %.1f us)\n", S, ticket, gub, gul, dnb, dnl, ia, ik, end,
         G * gub + E * ndn * dnb, (G * gub + E * ndn * dnb) / S);
  fg_timeline_print(w, 116, ia, ik, 44, 11);
  return 0;
}
