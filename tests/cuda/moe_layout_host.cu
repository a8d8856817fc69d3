// cuco_moe.cuh's layout of expert parallelism's moves, on the host: one rank's runs from every rank's counts.
#include "cuco.h"
#include "cuco_moe.cuh"

// runs: 5 int32 per run (src, dst, dstRow, n, counter), room for 2 * world * local; meta: nDispatch, nRuns, then
// combineAt[groups + 1]; expertAt: local + 1; dispatchIn: kMaxGroups; combineIn: 1.
CUCO_EXPORT int cuco_test_moe_layout(const int32_t* counts, int world, int me, int64_t E, int groups, int perGroup,
                                     int combineCounter, int32_t* runs, int32_t* meta, int64_t* expertAt,
                                     unsigned long long* dispatchIn, unsigned long long* combineIn) {
  const cuco::moe::Split sp{E, E / world, world, groups, perGroup != 0, combineCounter};
  if (E % world || groups < 1 || groups > cuco::moe::kMaxGroups || groups > sp.local) return 1;
  static cuco::moe::Layout L;
  cuco::moe::layout(sp, me, counts, (cuco::moe::Run*)runs, &L);
  meta[0] = L.nDispatch, meta[1] = L.nRuns;
  for (int g = 0; g <= groups; g++) meta[2 + g] = L.combineAt[g];
  for (int64_t e = 0; e <= sp.local; e++) expertAt[e] = L.expertAt[e];
  for (int g = 0; g < cuco::moe::kMaxGroups; g++) dispatchIn[g] = L.dispatchIn[g];
  *combineIn = L.combineIn;
  return 0;
}
