// Exact-number tests of model weight/KV sizes, the decode allocation program, and validate().
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "workload/alloc_program.h"
#include "workload/model_shape.h"

using namespace memsim;

namespace {

ModelShape llama31_8b() {
  ModelShape m;
  m.name = "llama-3.1-8b";
  m.layers = 32;
  m.hidden = 4096;
  m.heads = 32;
  m.kv_heads = 8;
  m.head_dim = 128;
  m.intermediate = 14336;
  m.vocab = 128256;
  m.dtype = DType::kBF16;
  m.tie_embeddings = false;
  return m;
}

// Peak of the summed bytes of live body tensors, walking the ops in order. If stop_at is
// non-empty, the walk stops before the alloc of the tensor with that name.
uint64_t peak_live(const GraphProgram& g, const std::string& stop_at = "") {
  uint64_t live = 0;
  uint64_t peak = 0;
  for (const ProgramOp& op : g.ops) {
    const TensorSpec& t = g.tensors[op.tensor];
    if (op.kind == ProgramOp::Kind::kAlloc) {
      if (!stop_at.empty() && t.name == stop_at) break;
      live += t.bytes;
      peak = std::max(peak, live);
    } else {
      live -= t.bytes;
    }
  }
  return peak;
}

const TensorSpec* find_tensor(const GraphProgram& g, const std::string& name) {
  for (const TensorSpec& t : g.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

size_t count_role(const GraphProgram& g, TensorRole r) {
  return static_cast<size_t>(std::count_if(g.tensors.begin(), g.tensors.end(),
                                           [r](const TensorSpec& t) { return t.role == r; }));
}

size_t count_name(const ShapeProgram& p, const std::string& name) {
  size_t n = 0;
  for (const GraphProgram& g : p.graphs) {
    for (const TensorSpec& t : g.tensors) n += t.name == name ? 1 : 0;
  }
  return n;
}

uint64_t total_alloc_bytes(const ShapeProgram& p) {
  uint64_t sum = 0;
  for (const GraphProgram& g : p.graphs) {
    for (const TensorSpec& t : g.tensors) sum += t.bytes;
  }
  return sum;
}

constexpr uint64_t kWorkspace = 4u << 20;  // 4 MiB

}  // namespace

TEST_CASE("dtype sizes and names") {
  CHECK(dtype_bytes(DType::kBF16) == 2);
  CHECK(dtype_bytes(DType::kFP16) == 2);
  CHECK(dtype_bytes(DType::kFP32) == 4);
  CHECK(dtype_bytes(DType::kFP8) == 1);
  CHECK(dtype_bytes(DType::kInt32) == 4);
  CHECK(dtype_bytes(DType::kInt64) == 8);
  CHECK(std::string(to_string(DType::kBF16)) == "bf16");
  CHECK(std::string(to_string(DType::kInt64)) == "int64");
  CHECK(std::string(to_string(TensorRole::kWorkspace)) == "workspace");
  CHECK(std::string(to_string(GraphMode::kPiecewise)) == "piecewise");
}

TEST_CASE("Llama-3.1-8B weight and KV bytes") {
  const ModelShape m = llama31_8b();
  // Parameters:
  //   embedding          128256 x 4096                          =   525,336,576
  //   per layer: q       4096 x 4096                            =    16,777,216
  //              k + v   2 x 4096 x 1024                        =     8,388,608
  //              o       4096 x 4096                            =    16,777,216
  //              mlp     3 x 4096 x 14336                       =   176,160,768
  //              norms   2 x 4096                               =         8,192
  //              layer total                                    =   218,112,000
  //   32 layers                                                 = 6,979,584,000
  //   final norm                                                =         4,096
  //   lm_head            128256 x 4096                          =   525,336,576
  //   total                                                     = 8,030,261,248
  // bf16: x 2 = 16,060,522,496 bytes.
  CHECK(m.weight_bytes() == 16'060'522'496ull);
  // 2 (K,V) x 32 layers x 8 kv heads x 128 x 2 bytes.
  CHECK(m.kv_bytes_per_token() == 131072);

  ModelShape tied = m;
  tied.tie_embeddings = true;
  CHECK(tied.weight_bytes() == 16'060'522'496ull - 525'336'576ull * 2);
}

TEST_CASE("other model weight counts match the published parameter counts") {
  ModelShape l70 = llama31_8b();
  l70.layers = 80;
  l70.hidden = 8192;
  l70.heads = 64;
  l70.intermediate = 28672;
  // 2 x 1,050,673,152 (embed + lm_head) + 80 x 855,654,400 + 8,192 = 70,553,706,496 params.
  CHECK(l70.weight_bytes() == 70'553'706'496ull * 2);

  ModelShape q3 = llama31_8b();
  q3.layers = 36;
  q3.intermediate = 12288;
  q3.vocab = 151936;
  q3.qk_norm = true;
  // 2 x 622,329,856 + 36 x 192,946,432 (incl. 2 x 128 qk-norm) + 4,096 = 8,190,735,360 params.
  CHECK(q3.weight_bytes() == 8'190'735'360ull * 2);

  ModelShape q25 = llama31_8b();
  q25.layers = 28;
  q25.hidden = 3584;
  q25.heads = 28;
  q25.kv_heads = 4;
  q25.intermediate = 18944;
  q25.vocab = 152064;
  q25.qkv_bias = true;
  // 2 x 544,997,376 + 28 x 233,057,792 (incl. 4,608 bias) + 3,584 = 7,615,616,512 params.
  CHECK(q25.weight_bytes() == 7'615'616'512ull * 2);
  // 2 x 28 x 4 x 128 x 2
  CHECK(q25.kv_bytes_per_token() == 57344);
}

TEST_CASE("RoPE inverse frequencies: default and Llama 3.1's llama3 scaling") {
  ModelShape q = llama31_8b();
  q.rope_theta = 1e6;
  const std::vector<float> plain = q.rope_inv_freq();
  REQUIRE(plain.size() == 64);
  CHECK(plain[0] == 1.0f);
  CHECK(plain[32] == 1.0f / std::pow(1e6f, 0.5f));  // theta^(-64/128)
  for (size_t i = 1; i < plain.size(); ++i) CHECK(plain[i] < plain[i - 1]);

  ModelShape l = llama31_8b();
  l.rope_theta = 500000;
  l.rope_scaling.factor = 8;  // low 1, high 4, original 8192 (config.json)
  const std::vector<float> f = l.rope_inv_freq();
  l.rope_scaling.factor = 0;
  const std::vector<float> base = l.rope_inv_freq();
  // Wavelength 2 pi / f: under 8192 / 4 = 2048 unchanged, over 8192 / 1 divided by 8, between
  // them a ramp from f / 8 to f.
  int kept = 0, divided = 0, ramped = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const double wavelen = 2 * 3.14159265358979 / base[i];
    if (wavelen < 2048) {
      CHECK(f[i] == base[i]);
      ++kept;
    } else if (wavelen > 8192) {
      CHECK(f[i] == base[i] / 8);
      ++divided;
    } else {
      CHECK(f[i] > base[i] / 8);
      CHECK(f[i] < base[i]);
      ++ramped;
    }
  }
  // theta 500000, head_dim 128: wavelen = 2 pi 500000^(i / 64): pairs 0..28 keep, 29..34
  // ramp, 35..63 are divided.
  CHECK(kept == 29);
  CHECK(ramped == 6);
  CHECK(divided == 29);
}

TEST_CASE("decode program inputs") {
  const ModelShape m = llama31_8b();
  ProgramOptions o;  // max_model_len 8192, block 16 -> 512 blocks per sequence
  const ShapeProgram p = make_decode_program(m, 256, o);
  CHECK(p.batch == 256);
  REQUIRE(p.inputs.size() == 5);
  CHECK(p.inputs[0].name == "input_ids");
  CHECK(p.inputs[0].bytes == 256 * 8);
  CHECK(p.inputs[1].name == "positions");
  CHECK(p.inputs[1].bytes == 256 * 8);
  CHECK(p.inputs[2].name == "slot_mapping");
  CHECK(p.inputs[2].bytes == 256 * 8);
  CHECK(p.inputs[3].name == "seq_lens");
  CHECK(p.inputs[3].bytes == 256 * 4);
  CHECK(p.inputs[4].name == "block_tables");
  CHECK(p.inputs[4].bytes == 256 * 512 * 4);
  for (const TensorSpec& t : p.inputs) CHECK(t.role == TensorRole::kInput);

  o.max_model_len = 8193;  // rounds up to 513 blocks
  CHECK(make_decode_program(m, 1, o).inputs[4].bytes == 513 * 4);
}

TEST_CASE("full-graph decode program, Llama-3.1-8B") {
  const ModelShape m = llama31_8b();
  ProgramOptions o;
  o.mode = GraphMode::kFull;

  SECTION("b=1, no workspace") {
    const ShapeProgram p = make_decode_program(m, 1, o);
    REQUIRE(p.graphs.size() == 1);
    const GraphProgram& g = p.graphs[0];
    CHECK(g.name == "b1.full");
    CHECK(validate(g).empty());
    // embed + layer0 (9) + 31 x 10 + final residual/norm, logits, logits_fp32, probs, sampled.
    CHECK(g.tensors.size() == 326);
    // 324 intermediates (alloc + free) + 2 outputs (alloc only).
    CHECK(g.ops.size() == 650);
    CHECK(count_role(g, TensorRole::kOutput) == 2);
    CHECK(count_role(g, TensorRole::kWorkspace) == 0);
    CHECK(count_name(p, "gemm_workspace") == 0);
    CHECK(g.tensors.front().name == "embed");
    CHECK(g.tensors.front().bytes == 4096 * 2);
    // Decoder layers: 2b(hidden + 3 intermediate) = 94,208 at the SiluAndMul (residual,
    // gate_up, act live). Head: logits_fp32 + probs + sampled ids = 8 b vocab + 8 b.
    CHECK(peak_live(g, "final.residual") == 94'208);
    CHECK(peak_live(g) == 1'026'056);
  }

  SECTION("b=256, 4 MiB workspace") {
    o.gemm_workspace_bytes = kWorkspace;
    const ShapeProgram p = make_decode_program(m, 256, o);
    REQUIRE(p.graphs.size() == 1);
    const GraphProgram& g = p.graphs[0];
    CHECK(g.name == "b256.full");
    CHECK(validate(g).empty());
    CHECK(g.tensors.size() == 327);
    CHECK(g.ops.size() == 651);
    CHECK(count_name(p, "gemm_workspace") == 1);
    CHECK(count_role(g, TensorRole::kWorkspace) == 1);

    // The workspace alloc comes right before layer 0's QKV GEMM, after its input norm.
    REQUIRE(g.ops.size() > 4);
    CHECK(g.tensors[g.ops[1].tensor].name == "layer0.input_norm");
    CHECK(g.tensors[g.ops[2].tensor].name == "gemm_workspace");
    CHECK(g.tensors[g.ops[2].tensor].role == TensorRole::kWorkspace);
    CHECK(g.tensors[g.ops[2].tensor].bytes == kWorkspace);
    CHECK(g.tensors[g.ops[3].tensor].name == "layer0.qkv");

    const TensorSpec* qkv = find_tensor(g, "layer3.qkv");
    REQUIRE(qkv);
    CHECK(qkv->bytes == 256ull * 6144 * 2);
    CHECK(qkv->role == TensorRole::kIntermediate);
    CHECK(find_tensor(g, "layer3.attn")->bytes == 256ull * 4096 * 2);
    CHECK(find_tensor(g, "layer3.gate_up")->bytes == 256ull * 2 * 14336 * 2);
    CHECK(find_tensor(g, "layer3.act")->bytes == 256ull * 14336 * 2);
    CHECK(find_tensor(g, "layer3.down")->bytes == 256ull * 4096 * 2);
    CHECK(find_tensor(g, "layer0.input_residual") == nullptr);  // residual is the embedding
    CHECK(find_tensor(g, "layer31.input_residual") != nullptr);
    CHECK(find_tensor(g, "logits")->bytes == 256ull * 128256 * 2);
    CHECK(find_tensor(g, "logits")->role == TensorRole::kIntermediate);
    CHECK(find_tensor(g, "probs")->role == TensorRole::kIntermediate);
    const TensorSpec* lf = find_tensor(g, "logits_fp32");
    REQUIRE(lf);
    CHECK(lf->bytes == 256ull * 128256 * 4);
    CHECK(lf->role == TensorRole::kOutput);
    const TensorSpec* ids = find_tensor(g, "sampled_ids");
    REQUIRE(ids);
    CHECK(ids->bytes == 256 * 8);
    CHECK(ids->role == TensorRole::kOutput);

    // Layers: 94,208 x 256 = 24,117,248 (+ workspace). Head: 8 x 256 x 128256 + 8 x 256 =
    // 262,670,336 (+ workspace, never freed).
    CHECK(peak_live(g, "final.residual") == 24'117'248 + kWorkspace);
    CHECK(peak_live(g) == 262'670'336 + kWorkspace);
  }
}

TEST_CASE("piecewise decode program, Llama-3.1-8B") {
  const ModelShape m = llama31_8b();
  ProgramOptions o;
  o.mode = GraphMode::kPiecewise;
  o.gemm_workspace_bytes = kWorkspace;
  const ShapeProgram p = make_decode_program(m, 64, o);

  REQUIRE(p.graphs.size() == m.layers + 2);
  for (const GraphProgram& g : p.graphs) {
    INFO(g.name);
    CHECK(validate(g).empty());
  }
  CHECK(p.graphs.front().name == "b64.embed");
  CHECK(p.graphs[1].name == "b64.layer00");
  CHECK(p.graphs[8].name == "b64.layer07");
  CHECK(p.graphs[32].name == "b64.layer31");
  CHECK(p.graphs.back().name == "b64.head");

  // Workspace: exactly once, in layer 00.
  CHECK(count_name(p, "gemm_workspace") == 1);
  CHECK(count_role(p.graphs[1], TensorRole::kWorkspace) == 1);

  const GraphProgram& embed = p.graphs.front();
  REQUIRE(embed.tensors.size() == 1);
  CHECK(embed.tensors[0].role == TensorRole::kOutput);
  CHECK(embed.ops.size() == 1);

  // Layer 0: 9 tensors + workspace; outputs down and post_attn_residual; 7 intermediates.
  const GraphProgram& l0 = p.graphs[1];
  CHECK(l0.tensors.size() == 10);
  CHECK(l0.ops.size() == 7 * 2 + 2 + 1);
  CHECK(count_role(l0, TensorRole::kOutput) == 2);
  CHECK(find_tensor(l0, "embed") == nullptr);  // previous graph's output is not re-allocated

  for (uint32_t i = 2; i <= m.layers; ++i) {
    const GraphProgram& g = p.graphs[i];
    INFO(g.name);
    CHECK(g.tensors.size() == 10);
    CHECK(g.ops.size() == 8 * 2 + 2);
    CHECK(count_role(g, TensorRole::kOutput) == 2);
    const std::string pre = "layer" + std::to_string(i - 1) + ".";
    REQUIRE(find_tensor(g, pre + "down"));
    CHECK(find_tensor(g, pre + "down")->role == TensorRole::kOutput);
    CHECK(find_tensor(g, pre + "post_attn_residual")->role == TensorRole::kOutput);
    CHECK(find_tensor(g, pre + "input_residual")->role == TensorRole::kIntermediate);
  }

  const GraphProgram& head = p.graphs.back();
  CHECK(head.tensors.size() == 6);
  CHECK(head.ops.size() == 4 * 2 + 2);
  CHECK(find_tensor(head, "logits_fp32")->role == TensorRole::kOutput);
  CHECK(find_tensor(head, "sampled_ids")->role == TensorRole::kOutput);
  CHECK(peak_live(head) == 8ull * 64 * 128256 + 8 * 64);

  // Same tensors as the full graph, just split.
  ProgramOptions full = o;
  full.mode = GraphMode::kFull;
  const ShapeProgram f = make_decode_program(m, 64, full);
  CHECK(total_alloc_bytes(p) == total_alloc_bytes(f));
  size_t tensors = 0;
  for (const GraphProgram& g : p.graphs) tensors += g.tensors.size();
  CHECK(tensors == f.graphs[0].tensors.size());
}

TEST_CASE("qk_norm adds q/k norm outputs per layer") {
  ModelShape m = llama31_8b();
  m.layers = 36;
  m.intermediate = 12288;
  m.vocab = 151936;
  m.qk_norm = true;
  const ShapeProgram p = make_decode_program(m, 8, ProgramOptions{});
  REQUIRE(p.graphs.size() == 1);
  const GraphProgram& g = p.graphs[0];
  CHECK(validate(g).empty());
  CHECK(g.tensors.size() == 10 * 36 + 6 + 2 * 36);
  CHECK(find_tensor(g, "layer5.q_norm")->bytes == 8ull * 4096 * 2);
  CHECK(find_tensor(g, "layer5.k_norm")->bytes == 8ull * 1024 * 2);
}

TEST_CASE("validate rejects malformed graphs") {
  using K = ProgramOp::Kind;
  GraphProgram good;
  good.name = "t";
  good.tensors = {{"a", 16, TensorRole::kIntermediate}, {"out", 8, TensorRole::kOutput}};
  good.ops = {{K::kAlloc, 0}, {K::kAlloc, 1}, {K::kFree, 0}};
  REQUIRE(validate(good).empty());

  SECTION("double free") {
    GraphProgram g = good;
    g.ops.push_back({K::kFree, 0});
    CHECK_FALSE(validate(g).empty());
  }
  SECTION("free before alloc") {
    GraphProgram g = good;
    g.ops = {{K::kFree, 0}, {K::kAlloc, 0}, {K::kAlloc, 1}};
    CHECK_FALSE(validate(g).empty());
  }
  SECTION("free of an output") {
    GraphProgram g = good;
    g.ops.push_back({K::kFree, 1});
    CHECK_FALSE(validate(g).empty());
  }
  SECTION("free of a workspace") {
    GraphProgram g = good;
    g.tensors.push_back({"ws", 64, TensorRole::kWorkspace});
    g.ops.push_back({K::kAlloc, 2});
    REQUIRE(validate(g).empty());
    g.ops.push_back({K::kFree, 2});
    CHECK_FALSE(validate(g).empty());
  }
  SECTION("zero-byte tensor") {
    GraphProgram g = good;
    g.tensors[0].bytes = 0;
    CHECK_FALSE(validate(g).empty());
  }
  SECTION("input role") {
    GraphProgram g = good;
    g.tensors[1].role = TensorRole::kInput;
    CHECK_FALSE(validate(g).empty());
  }
  SECTION("double alloc") {
    GraphProgram g = good;
    g.ops.insert(g.ops.begin() + 1, {K::kAlloc, 0});
    CHECK_FALSE(validate(g).empty());
  }
  SECTION("intermediate never freed") {
    GraphProgram g = good;
    g.ops.pop_back();
    CHECK_FALSE(validate(g).empty());
  }
  SECTION("tensor never allocated") {
    GraphProgram g = good;
    g.ops.erase(g.ops.begin() + 1);
    CHECK_FALSE(validate(g).empty());
  }
  SECTION("op index out of range") {
    GraphProgram g = good;
    g.ops.push_back({K::kAlloc, 7});
    CHECK_FALSE(validate(g).empty());
  }
}

TEST_CASE("make_decode_program rejects degenerate arguments") {
  const ModelShape m = llama31_8b();
  CHECK_THROWS_AS(make_decode_program(m, 0, ProgramOptions{}), std::invalid_argument);
  ProgramOptions o;
  o.kv_block_size = 0;
  CHECK_THROWS_AS(make_decode_program(m, 1, o), std::invalid_argument);
  ModelShape empty;
  CHECK_THROWS_AS(make_decode_program(empty, 1, ProgramOptions{}), std::invalid_argument);
}
