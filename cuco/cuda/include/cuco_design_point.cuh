/*************************************************************************
 * cuco_design_point.cuh: the design space's dimensions as enums, and the point a strategy kernel is compiled
 * for as typed constants (cuco::kBackend, kPlacement, kSync, kIssuer, kChunks).
 *
 * cuco/evolve/strategy.py defines one macro per dimension naming its enumerator (CUCO_PLACEMENT StreamOverlap)
 * and CUCO_CHUNKS, only for points the strategy's workload.toml accepts: that list is the only accept-list, so a
 * strategy checks no macros of its own. The enumerators are cuco/designspace/dimensions.py's values in CamelCase
 * (a test holds the two alike).
 *************************************************************************/
#ifndef CUCO_DESIGN_POINT_CUH_
#define CUCO_DESIGN_POINT_CUH_

namespace cuco {

enum class Backend { Lsa, Ce, Gin, NcclHost, Nvshmem };
enum class Placement { Deferred, StreamOverlap, SplitPutWait, Fused };
enum class Sync { Global, Peer, Chunk, Tile };
enum class Issuer { Thread, Warp, Cta, MultiCta };

// The most chunks (CHUNK_CHOICES in dimensions.py): arrays sized by it (chunk counters, events) are alike at every
// point.
constexpr int kMaxChunks = 16;

// The point, where the program is compiled at one (cuco_strategy.cuh requires it).
#if defined(CUCO_BACKEND) && defined(CUCO_PLACEMENT) && defined(CUCO_SYNC) && defined(CUCO_ISSUER) && defined(CUCO_CHUNKS)
constexpr Backend kBackend = Backend::CUCO_BACKEND;
constexpr Placement kPlacement = Placement::CUCO_PLACEMENT;
constexpr Sync kSync = Sync::CUCO_SYNC;
constexpr Issuer kIssuer = Issuer::CUCO_ISSUER;
constexpr int kChunks = CUCO_CHUNKS;
static_assert(kChunks >= 1 && kChunks <= kMaxChunks, "CUCO_CHUNKS is 1..kMaxChunks");

// A strategy's `using namespace cuco::point;`: the point and its dimensions' enums, unqualified.
namespace point {
using cuco::Backend;
using cuco::Issuer;
using cuco::Placement;
using cuco::Sync;
using cuco::kBackend;
using cuco::kChunks;
using cuco::kIssuer;
using cuco::kPlacement;
using cuco::kSync;
}  // namespace point
#endif

}  // namespace cuco

#endif  // CUCO_DESIGN_POINT_CUH_
