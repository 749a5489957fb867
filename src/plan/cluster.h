// Cluster description for `kestrel plan`: the accelerator, the node layout of the prefill and decode
// roles, their parallelism, and the modelling assumptions. Read from a small JSON file or a named
// preset, then overridden by CLI flags; `validate` checks everything before the planner runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"
#include "plan/inventory.h"
#include "plan/model_costs.h"

namespace kestrel::plan {

// Per-GPU figures, dense (no structured sparsity), SI units.
struct Accelerator {
  std::string name;
  double hbm_bytes = 0;        // capacity
  double hbm_bw = 0;           // bytes/s
  double bf16_flops = 0;       // FLOP/s
  double fp8_flops = 0;        // FLOP/s
  double nvlink_bw = 0;        // bytes/s per GPU, one direction, inside the NVLink domain
  double network_bw = 0;       // bytes/s per GPU, one direction, between NVLink domains
  int nvlink_domain_gpus = 8;  // GPUs that reach each other over NVLink
  std::string source;          // where the numbers come from
};

// Built-in accelerators: h100, h200, b200, b300, gb200, gb300.
Result<Accelerator> accelerator_preset(const std::string& name);
std::vector<std::string> accelerator_preset_names();

struct RoleSpec {
  int nodes = 4;
  int tp = 8;   // attention / dense / shared-expert tensor parallel group
  int ep = 8;   // routed-expert parallel group; instance size = max(tp, ep)
  int dcp = 1;  // decode context parallel: MLA/indexer cache split over dcp ranks of the TP group
  int batch = 0;  // decode sequences per instance; 0 = as many as the cache holds at `context`
};

struct Assumptions {
  double memory_utilization = 0.90;  // fraction of HBM the engine may use (vLLM's default)
  double reserve_bytes = 4.0 * (1ull << 30);  // activations, graphs, comm buffers per device
  double mfu = 0.40;                  // achieved / peak FLOP/s for prefill and decode matmuls
  double bw_efficiency = 0.80;        // achieved / peak HBM bandwidth
  double comm_efficiency = 0.70;      // achieved / peak link bandwidth
  bool expert_math_fp8 = false;       // routed-expert matmuls at the fp8 peak (W4A8/MXFP8 on Blackwell)
  // Measured P→D hand-off throughput per link, bytes/s (bench/pd_transfer_bench: the whole transfer path, not
  // the wire alone); the hand-off then takes bytes / (prefill instance links × this). 0: the NICs' datasheet
  // bandwidth × comm_efficiency.
  double transfer_bw = 0;
  StateOptions state;
  InventoryOptions weights;
};

struct ClusterSpec {
  Accelerator accel;
  int gpus_per_node = 8;
  RoleSpec prefill, decode;
  int64_t context = 1 << 20;  // tokens per request for capacity, prefill length and decode context
  Assumptions a;
};

// A preset cluster: 4 prefill + 4 decode nodes of `accelerator` (8 GPUs per node; 4 for GB200/GB300
// trays), TP 8 / EP 8, 1M context.
Result<ClusterSpec> cluster_preset(const std::string& accelerator);

// Parses a cluster JSON document (schema in docs/PERFORMANCE.md "kestrel plan"); unknown keys are
// errors so typos do not silently fall back to defaults. `label` names the source in errors.
Result<ClusterSpec> parse_cluster_spec(const std::string& json_text, const std::string& label);

// Checks ranges and divisibility against the model (TP must divide the attention and KDA heads, the
// instance size must divide the role's GPUs, DCP must divide TP).
Status validate(const ClusterSpec& c, const ModelConfig& cfg);

}  // namespace kestrel::plan
