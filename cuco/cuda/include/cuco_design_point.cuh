/*************************************************************************
 * cuco_design_point.cuh: the dimensions every strategy kernel has, as constants of the point it was compiled
 * for. cuco/evolve/strategy.py defines CUCO_<DIMENSION>_<VALUE> and CUCO_CHUNKS for the point; backend,
 * placement and sync each strategy checks itself, since each accepts its own subset of them.
 *************************************************************************/
#ifndef CUCO_DESIGN_POINT_CUH_
#define CUCO_DESIGN_POINT_CUH_

#include "cuco_strategy.cuh"

#if defined(CUCO_ISSUER_CTA) + defined(CUCO_ISSUER_WARP) != 1
#error "define exactly one issuer: CUCO_ISSUER_CTA or CUCO_ISSUER_WARP"
#endif
#if !defined(CUCO_CHUNKS) || CUCO_CHUNKS < 1 || CUCO_CHUNKS > 16
#error "CUCO_CHUNKS must be 1..16"
#endif

namespace cuco {

#if defined(CUCO_ISSUER_CTA)
constexpr Issuer kIssuer = Issuer::Cta;
#else
constexpr Issuer kIssuer = Issuer::Warp;
#endif
constexpr int kChunks = CUCO_CHUNKS;
constexpr int kMaxChunks = 16;  // CUCO_CHUNKS's bound: arrays sized by it (chunk counters) are alike at every point

}  // namespace cuco

#endif  // CUCO_DESIGN_POINT_CUH_
