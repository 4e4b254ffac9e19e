// The rank launcher of tensor-parallel --backend cuda runs (src/app/rank_launch.h), without a GPU:
// the NCCL id's hex form, the environment every rank gets, and a failing rank stopping the others.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "src/app/rank_launch.h"
#include "tests/temp_dir.h"

using namespace memsim;

TEST_CASE("rank launch: the NCCL id round-trips through hex; bad hex is refused") {
  NcclUniqueId id{};
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 37 + 5);
  const std::string hex = nccl_id_hex(id);
  REQUIRE(hex.size() == 256);
  CHECK(hex.substr(0, 6) == "052a4f");
  NcclUniqueId back{};
  REQUIRE(nccl_id_from_hex(hex, &back));
  CHECK(back == id);
  CHECK_FALSE(nccl_id_from_hex(hex.substr(1), &back));              // 255 digits
  CHECK_FALSE(nccl_id_from_hex("zz" + hex.substr(2), &back));       // not hex
  CHECK_FALSE(nccl_id_from_hex(hex.substr(0, 254) + "0x", &back));  // a partial byte
  CHECK_FALSE(nccl_id_from_hex("-1" + hex.substr(2), &back));       // strtoul would take these
  CHECK_FALSE(nccl_id_from_hex(" f" + hex.substr(2), &back));
  CHECK_FALSE(nccl_id_from_hex("+f" + hex.substr(2), &back));
}

TEST_CASE("rank launch: every rank's environment turns NVLink multicast off") {
  const std::vector<std::string> env = rank_environment(false);
  CHECK(std::find(env.begin(), env.end(), "NCCL_NVLS_ENABLE=0") != env.end());
  CHECK(std::find(env.begin(), env.end(), "NCCL_CUMEM_ENABLE=0") != env.end());
  CHECK(std::find(env.begin(), env.end(), "TORCH_SYMM_MEM_DISABLE_MULTICAST=1") != env.end());
  const std::vector<std::string> cumem = rank_environment(true);
  CHECK(std::find(cumem.begin(), cumem.end(), "NCCL_CUMEM_ENABLE=1") != cumem.end());
  CHECK(std::find(cumem.begin(), cumem.end(), "NCCL_NVLS_ENABLE=0") != cumem.end());
}

TEST_CASE("rank launch: a failing rank stops the others, and its log is named") {
  memsim::test::TempDir dir;
  std::vector<RankProcess> ranks(2);
  ranks[0].log = (dir.path() / "rank0.log").string();
  ranks[1].log = (dir.path() / "rank1.log").string();
  // Rank 0 would wait a minute for a peer; rank 1 fails at once after printing its environment.
  REQUIRE(start_rank({"/bin/sleep", "60"}, 0, false, ranks[0]).empty());
  REQUIRE(start_rank({"/usr/bin/env"}, 1, false, ranks[1]).empty());
  // env exits 0: wait for it, then make the failing one.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<RankProcess> one = {ranks[1]};
  CHECK(wait_ranks(one, 10).empty());
  std::ifstream env_out(ranks[1].log);
  const std::string text((std::istreambuf_iterator<char>(env_out)), {});
  CHECK(text.find("NCCL_NVLS_ENABLE=0") != std::string::npos);
  ranks[1].log = (dir.path() / "rank1b.log").string();
  REQUIRE(start_rank({"/bin/false"}, 1, false, ranks[1]).empty());
  const std::string problem = wait_ranks(ranks, 50);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(problem.find("a rank failed: rank 1 exited 1") != std::string::npos);
  CHECK(problem.find("rank1b.log and ") != std::string::npos);
  CHECK(problem.find("rank1b.log.err") != std::string::npos);
  CHECK(took < 10);  // the sleeping rank was killed, not waited for
  CHECK(ranks[0].pid == -1);
  CHECK(ranks[1].pid == -1);
}

TEST_CASE("rank launch: ranks that outlive the deadline are killed") {
  memsim::test::TempDir dir;
  std::vector<RankProcess> ranks(1);
  ranks[0].log = (dir.path() / "rank0.log").string();
  REQUIRE(start_rank({"/bin/sleep", "60"}, 0, false, ranks[0]).empty());
  const std::string problem = wait_ranks(ranks, 1);
  CHECK(problem == "the ranks did not finish in 1 s");
  CHECK(ranks[0].pid == -1);
}

TEST_CASE("rank launch: a program that cannot start is said, with why") {
  memsim::test::TempDir dir;
  RankProcess p;
  p.log = (dir.path() / "rank0.log").string();
  const std::string why = start_rank({"/nonexistent/memsim"}, 0, false, p);
  CHECK(why.find("cannot start a rank") != std::string::npos);
  CHECK(p.pid < 0);
}

TEST_CASE("rank launch: this process's own command line") {
  const std::vector<std::string> argv = own_command_line();
  REQUIRE_FALSE(argv.empty());
  CHECK(std::filesystem::path(argv[0]).filename() == "test_rank_launch");
}
