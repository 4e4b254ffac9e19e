// Shared by the RL tests: the source root, model and GPU files, a small RL config (two
// iterations of 8 x 4 short requests on an H200) and a saver run.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "src/config/config_node.h"
#include "src/config/loaders.h"
#include "src/rl/rl_timeline.h"
#include "src/serve/serving_experiment.h"

namespace memsim::test {

inline std::string root() {
  const char* r = std::getenv("MEMSIM_SOURCE_ROOT");
  return r != nullptr ? r : ".";
}

inline ModelShape model(const std::string& name) {
  return load_model_shape(ConfigNode::load_file(root() + "/configs/models/" + name + ".yaml"));
}

inline GpuSpec h200() {
  return load_gpu_spec(ConfigNode::load_file(root() + "/configs/gpus/h200.yaml"));
}

inline RlConfig small_config(const std::string& model_name) {
  RlConfig c;
  c.gpu = h200();
  c.models = {model(model_name)};
  c.iterations = 2;
  c.train.dp = 8;
  c.train.micro_batch_tokens = 4096;
  c.rollout.gpu_memory_utilization = 0.85;
  c.rollout.serve.max_model_len = 4096;
  c.rollout.kv_factory =
      parse_kv(ConfigNode::parse("{impl: paged_block_pool, block_size: 16}", "test")).factory;
  c.rollout.requests.count = 8;
  c.rollout.requests.n = 4;
  c.rollout.requests.arrival.process = ArrivalProcess::kBurst;
  c.rollout.requests.prompt = {LengthDist::kFixed, 512};
  c.rollout.requests.output = {LengthDist::kFixed, 256};
  c.allocator = caching_allocators()
                    .find("torch_caching")
                    ->parse(ConfigNode::parse("{impl: torch_caching}", "test"));
  c.max_utilization = false;
  return c;
}

inline RlRunSpec saver_run(const std::string& label, const char* impl, const char* yaml,
                           bool multi_stage) {
  RlRunSpec r;
  r.label = label;
  r.saver = impl;
  r.saver_factory = memory_savers().find(impl)->parse(ConfigNode::parse(yaml, "test"));
  r.saver_tags = r.saver == "sleep_mode"
                     ? std::vector<std::string>{"weights", "kv_cache"}
                     : std::vector<std::string>{"weights", "kv_cache", "cuda_graph"};
  r.multi_stage = multi_stage;
  return r;
}

inline uint64_t round_up(uint64_t v, uint64_t m) {
  return (v + m - 1) / m * m;
}

inline GpuSpec h100() {
  return load_gpu_spec(ConfigNode::load_file(root() + "/configs/gpus/h100.yaml"));
}

}  // namespace memsim::test
