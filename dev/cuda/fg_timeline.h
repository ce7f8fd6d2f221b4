/* fg_timeline.h: the printout of a one-launch gate/up + down timeline (lab version 116, dev/cuda/qr_diet_lab.cuh
 * qr_fgx_kernel: FG_TL_WORDS words per ticket, the layout in that kernel's comment), host code only, shared by the
 * lab (dev/cuda/moe_quant.cu, the GPU's stamps) and dev/cuda/fg_sim.cpp (the slot model's schedule on the CPU, the
 * same printout). Needs <vector>, <algorithm>, <stdio.h>, <stdint.h> and quant(v, q) (a sorted quantile). */
#ifndef DG_DEV_FG_TIMELINE_H
#define DG_DEV_FG_TIMELINE_H
#define FG_TL_WORDS 14
/* The timeline of a launch of version 116 (dev/cuda/qr_diet_lab.cuh qr_fgx_kernel, qr_fgx_buf:
 * FG_TL_WORDS words per ticket), printed under its gate_up+down row. nst_gu, nst_dn: the weight stages of a gate/up
 * and a down item. Lines: the span, SM clock, the order (ia, ik); the ticket (entry to the ticket shared, us); per
 * product the phases as version 110's (median [p10 p90] over the blocks of experts with rows; for down blocks rows
 * counts from the wait's end); the down blocks' waits (ticket to the wait's end: median, p90, max, how many over
 * 1 us, their sum in slot-us and as us of the whole machine); per expert its first down ticket against its last
 * gate/up block's count (median [p10 p90], how many experts' down blocks came before it: those waited); gate/up's
 * last round (from the last gate/up ticket to the last gate/up block's end): the mean slots running gate/up,
 * running down, waiting (down blocks before their wait ended) and idle (of the most blocks resident at once); the
 * down-only stretch after it; the tail (last start to end); then the slots over the span in 16 bins (gate/up
 * running, down waiting, down running, idle). */
static void fg_timeline_print(const std::vector<uint64_t> &w, int ver, int ia, int ik, int nst_gu, int nst_dn) {
  const size_t nb = w.size() / FG_TL_WORDS;
  if (!nb) return;
  auto B = [&](size_t b) { return &w[b * FG_TL_WORDS]; };
  uint64_t g0 = UINT64_MAX, g1 = 0;
  double sc = 0, sg = 0;
  for (size_t b = 0; b < nb; b++) {
    g0 = std::min(g0, B(b)[0]);
    g1 = std::max(g1, B(b)[1]);
    sc += (double)(B(b)[7] - B(b)[2]);
    sg += (double)(B(b)[1] - B(b)[0]);
  }
  const double cpn = sg > 0 ? sc / sg : 1.0, span = (g1 - g0) * 1e-3;
  auto us = [&](uint64_t c0, uint64_t c1) { return (double)(int64_t)(c1 - c0) / cpn * 1e-3; };
  auto gus = [&](uint64_t t0, uint64_t t1) { return (double)(int64_t)(t1 - t0) * 1e-3; };
  std::vector<double> tick, ph[2][6], wt;
  int E = 0;
  for (size_t b = 0; b < nb; b++) E = std::max(E, (int)(B(b)[9] >> 32) + 1);
  std::vector<uint64_t> gudone(E, 0), dnfirst(E, UINT64_MAX);
  uint64_t tG = 0, tGend = 0, tlast = 0;
  long nwait1 = 0;
  double wsum = 0;
  for (size_t b = 0; b < nb; b++) {
    const uint64_t *x = B(b);
    const int prod = (int)(x[13] >> 32), e = (int)(x[9] >> 32);
    const long cnt = (long)(uint32_t)x[9];
    tick.push_back(us(x[2], x[10]));
    tlast = std::max(tlast, x[0]);
    if (prod == 0) {
      tG = std::max(tG, x[11]);
      tGend = std::max(tGend, x[1]);
    }
    if (cnt == 0) continue;
    if (prod == 0) gudone[e] = std::max(gudone[e], x[12]);
    else {
      dnfirst[e] = std::min(dnfirst[e], x[11]);
      const double wv = gus(x[11], x[12]);
      wt.push_back(wv);
      wsum += wv;
      nwait1 += wv > 1.0;
    }
    ph[prod][0].push_back(us(x[10], x[3]) - (prod ? gus(x[11], x[12]) : 0.0));
    ph[prod][1].push_back(us(x[3], x[4]));
    if (x[5]) ph[prod][2].push_back(us(x[4], x[5]));
    if (x[5]) ph[prod][3].push_back(us(x[5], x[6]));
    ph[prod][4].push_back(us(x[6], x[7]));
    ph[prod][5].push_back(us(x[2], x[7]));
  }
  std::vector<double> lag;
  long before = 0;
  for (int e = 0; e < E; e++)
    if (gudone[e] && dnfirst[e] != UINT64_MAX) {
      lag.push_back(gus(gudone[e], dnfirst[e]));
      before += dnfirst[e] < gudone[e];
    }
  /* the slots: the most blocks at once (start +1, end -1) */
  std::vector<std::pair<uint64_t, int>> ev;
  for (size_t b = 0; b < nb; b++) {
    ev.push_back({B(b)[0], 1});
    ev.push_back({B(b)[1], -1});
  }
  std::sort(ev.begin(), ev.end(), [](const std::pair<uint64_t, int> &p, const std::pair<uint64_t, int> &q) {
    return p.first != q.first ? p.first < q.first : p.second < q.second;
  });
  int cur = 0, cmax = 0;
  for (auto &v : ev) cmax = std::max(cmax, cur += v.second);
  /* slot-time of each kind over [t0, t1): 0 gate/up running, 1 down waiting, 2 down running, 3 blocks of experts
   * without rows */
  auto occ = [&](uint64_t t0, uint64_t t1, double o[4]) {
    for (int k = 0; k < 4; k++) o[k] = 0;
    if (t1 <= t0) return;
    auto add = [&](int k, uint64_t a, uint64_t b) {
      const uint64_t lo = std::max(a, t0), hi = std::min(b, t1);
      if (hi > lo) o[k] += (double)(hi - lo);
    };
    for (size_t b = 0; b < nb; b++) {
      const uint64_t *x = B(b);
      const int prod = (int)(x[13] >> 32);
      if ((uint32_t)x[9] == 0) add(3, x[0], x[1]);
      else if (prod == 0) add(0, x[0], x[1]);
      else {
        add(1, x[0], x[12]);
        add(2, x[12], x[1]);
      }
    }
    for (int k = 0; k < 4; k++) o[k] /= (double)(t1 - t0);
  };
  printf("  timeline (version %d): %zu blocks (tickets), order ia %d ik %d; clock %.3f GHz; span %.1f us; at most %d "
         "blocks at once\n", ver, nb, ia, ik, cpn, span, cmax);
  printf("   ticket (entry to the ticket shared) us: median %.2f [%.2f %.2f]\n", quant(tick, 0.5), quant(tick, 0.1),
         quant(tick, 0.9));
  static const char *nm[6] = {"rows", "act0", "w0", "loop", "epi", "block"};
  for (int p = 0; p < 2; p++) {
    printf("   %s phases us (%zu blocks):", p ? "down" : "gate/up", ph[p][5].size());
    for (int k = 0; k < 6; k++)
      printf("%s %s %.2f [%.2f %.2f]", k ? " |" : "", nm[k], quant(ph[p][k], 0.5), quant(ph[p][k], 0.1),
             quant(ph[p][k], 0.9));
    printf(" | loop/stage %.3f\n", quant(ph[p][3], 0.5) / (p ? nst_dn : nst_gu));
  }
  printf("   down waits us: median %.2f, p90 %.2f, max %.2f; %ld of %zu over 1 us; sum %.0f slot-us = %.2f us of the "
         "%d slots\n", quant(wt, 0.5), quant(wt, 0.9), quant(wt, 1.0), nwait1, wt.size(), wsum, wsum / cmax, cmax);
  printf("   per expert, first down ticket - last gate/up count, us: median %.1f [p10 %.1f, p90 %.1f, min %.1f]; %ld of "
         "%zu experts' down blocks came before it\n", quant(lag, 0.5), quant(lag, 0.1), quant(lag, 0.9), quant(lag, 0.0),
         before, lag.size());
  double o[4];
  occ(tG, tGend, o);
  printf("   gate/up's last round (last gate/up ticket %.1f us to the last gate/up end %.1f us: %.1f us): slots gate/up "
         "%.1f, down running %.1f, down waiting %.1f, empty experts %.1f, idle %.1f of %d\n", gus(g0, tG), gus(g0, tGend),
         gus(tG, tGend), o[0], o[2], o[1], o[3], cmax - o[0] - o[1] - o[2] - o[3], cmax);
  occ(tGend, g1, o);
  printf("   after it (down only, %.1f us): slots down running %.1f, waiting %.1f, idle %.1f; tail (last start %.1f us to "
         "the end) %.1f us\n", gus(tGend, g1), o[2], o[1], cmax - o[0] - o[1] - o[2] - o[3], gus(g0, tlast),
         gus(tlast, g1));
  occ(g0, g1, o);
  printf("   over the span: slots gate/up %.1f, down running %.1f, waiting %.1f, empty %.1f, idle %.1f (busy %.1f %%)\n",
         o[0], o[2], o[1], o[3], cmax - o[0] - o[1] - o[2] - o[3], 100.0 * (o[0] + o[1] + o[2] + o[3]) / cmax);
  printf("   slots over time (16 bins: from-to us gate/up | down running | waiting | idle):");
  for (int k = 0; k < 16; k++) {
    const uint64_t t0 = g0 + (g1 - g0) * k / 16, t1 = g0 + (g1 - g0) * (k + 1) / 16;
    occ(t0, t1, o);
    printf("%s %.0f-%.0f %.0f|%.0f|%.0f|%.0f", k ? ";" : "", gus(g0, t0), gus(g0, t1), o[0], o[2], o[1],
           cmax - o[0] - o[1] - o[2] - o[3]);
  }
  printf("\n");
}

#endif
