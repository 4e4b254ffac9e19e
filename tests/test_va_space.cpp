// Exact-number tests of VaSpace, the sim backend's first-fit virtual address allocator.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "backends/sim/va_space.h"

namespace memsim {
namespace {

template <class R>
ErrorCode err(const R& r) {
  REQUIRE_FALSE(r.ok());
  return r.error().code;
}

constexpr ErrorCode kInvArg = ErrorCode::kInvalidArgument;
constexpr ErrorCode kOom = ErrorCode::kOutOfMemory;

TEST_CASE("VaSpace: first fit, alignment, coalescing, exhaustion", "[va_space]") {
  constexpr uint64_t kBase = 1ull << 20, kP = 4096;
  VaSpace v(kBase, 64 * kP);
  const uint64_t a = *v.alloc(kP, kP), b = *v.alloc(2 * kP, kP), c = *v.alloc(kP, kP);
  CHECK((a == kBase && b == kBase + kP && c == kBase + 3 * kP));
  CHECK(v.in_use() == 4 * kP);
  CHECK(v.size_of(b) == 2 * kP);
  CHECK(v.size_of(b + kP) == 0);
  REQUIRE(*v.free(b) == 2 * kP);
  CHECK(*v.alloc(kP, kP) == b);  // first fit: the hole left by b, not the tail
  REQUIRE((v.free(b).ok() && v.free(a).ok()));
  CHECK(err(v.free(a)) == kInvArg);
  CHECK(*v.alloc(3 * kP, kP) == a);  // a and b coalesced: A+B fits at A
  CHECK(v.in_use() == 4 * kP);

  // Alignment: a 64 KiB-aligned range skips ahead; the gap before it stays usable.
  const uint64_t al = *v.alloc(kP, 16 * kP);
  CHECK(al == kBase + 16 * kP);
  CHECK(*v.alloc(kP, kP) == kBase + 4 * kP);
  CHECK(err(v.alloc(0, kP)) == kInvArg);
  CHECK(err(v.alloc(kP, 3 * kP)) == kInvArg);

  // Exhaustion.
  auto big = v.alloc(64 * kP, kP);
  CHECK(err(big) == kOom);
  CHECK(big.error().bytes_short == 64 * kP);
  CHECK(*v.alloc(47 * kP, kP) == al + kP);   // the whole tail
  CHECK(err(v.alloc(12 * kP, kP)) == kOom);  // the gap holds 11 pages
  CHECK(v.alloc(11 * kP, kP).ok());
  CHECK(v.in_use() == 64 * kP);
  CHECK(err(v.alloc(kP, kP)) == kOom);

  SECTION("freeing everything in any order coalesces back to one range") {
    VaSpace w(kBase, 32 * kP);
    std::vector<uint64_t> got;
    for (int i = 0; i < 8; ++i) got.push_back(*w.alloc(4 * kP, kP));
    for (int i : {3, 1, 0, 7, 5, 2, 6, 4}) REQUIRE(w.free(got[i]).ok());
    CHECK(w.in_use() == 0);
    CHECK(*w.alloc(32 * kP, kP) == kBase);
  }
}

}  // namespace
}  // namespace memsim
