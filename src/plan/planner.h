// `kestrel plan`: memory per device, cache capacity and roofline throughput of a prefill/decode
// layout. Every number is an estimate from first principles (bytes, FLOPs, peaks); the assumptions
// are fields of the ClusterSpec and are echoed in the output.
#pragma once

#include <string>

#include "plan/cluster.h"
#include "plan/inventory.h"
#include "plan/model_costs.h"

namespace kestrel::plan {

struct RolePlan {
  std::string role;  // "prefill" | "decode"
  RoleSpec spec;
  int devices = 0, instance_devices = 0, instances = 0, dp_attn = 0;

  // Memory per device.
  double weight_bytes = 0;        // all weights this device holds
  double weight_replicated = 0, weight_tensor = 0, weight_expert = 0;
  double usable_bytes = 0;        // HBM × utilization − reserve
  double cache_bytes = 0;         // usable − weights (0 when the weights do not fit)
  bool fits = false;              // weights fit and at least one request of `context` fits per DP group
  std::string note;               // why it does not fit, if it does not

  // Cache capacity.
  double cache_bytes_per_token_device = 0;   // MLA + indexer bytes one token costs on one device
  double state_bytes_per_request_device = 0; // KDA state on one device
  double request_bytes_device = 0;           // one request of `context` tokens on one device
  double tokens_per_device = 0;              // tokens of cache one device holds (no KDA state)
  double tokens_per_instance = 0;            // distinct tokens cached by one instance
  long long requests_per_instance = 0;       // concurrent requests of `context` tokens
  long long requests_per_role = 0;

  // Prefill roofline (prompt of `context` tokens).
  double prefill_flops_per_token = 0;   // mean over the prompt, bf16 + fp8 parts
  double prefill_tokens_per_s_instance = 0, prefill_tokens_per_s_gpu = 0, prefill_tokens_per_s_role = 0;
  double ttft_s = 0;                    // one prompt alone on one instance

  // Decode roofline at `context` tokens of history.
  long long batch = 0;                  // sequences per instance
  double step_weight_bytes = 0, step_cache_bytes = 0;  // per device per step
  double step_flops = 0;                               // per device per step
  double t_memory = 0, t_compute = 0, t_comm = 0, step_s = 0;
  double decode_tokens_per_s_instance = 0, decode_tokens_per_s_gpu = 0, decode_tokens_per_s_role = 0;
  double tokens_per_s_per_user = 0;
};

struct Plan {
  std::string model_label;
  ModelCosts costs;
  Inventory inventory;
  ClusterSpec cluster;
  RolePlan prefill, decode;  // a role with 0 nodes has devices == 0
  double transfer_bytes_per_request = 0;  // MLA + indexer pages + KDA state, prefill → decode
  double transfer_s = 0;                  // over the prefill instance's network links
  double transfer_link_bw = 0;            // bytes/s per link used for transfer_s
  bool transfer_measured = false;         // transfer_link_bw is Assumptions::transfer_bw (else the NIC roofline)
};

Result<Plan> make_plan(const ModelConfig& cfg, const std::string& model_label, const ClusterSpec& cluster);

}  // namespace kestrel::plan
