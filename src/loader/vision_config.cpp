#include "loader/vision_config.h"

#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "loader/json_reader.h"

namespace kestrel {

Result<VisionConfig> parse_vision_config(const std::string& json_text, const std::string& where) {
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, false);
  const std::string label = where + " vision_config";
  if (!j.is_object()) return invalid_argument(label + ": must be an object");
  config_detail::Reader r(j, label);
  VisionConfig v;
  v.num_layers = r.req_int("vt_num_hidden_layers");
  v.hidden = r.req_int("vt_hidden_size");
  v.intermediate = r.req_int("vt_intermediate_size");
  v.num_heads = r.req_int("vt_num_attention_heads");
  v.qkv_hidden = r.req_int("qkv_hidden_size");
  v.patch_size = r.req_int("patch_size");
  v.pos_emb_height = r.req_int("init_pos_emb_height");
  v.pos_emb_width = r.req_int("init_pos_emb_width");
  v.text_hidden = r.req_int("text_hidden_size");
  v.mm_hidden = r.opt_int("mm_hidden_size", v.hidden);
  v.projector_ln_eps = r.opt_float("projector_ln_eps", 1e-5f);
  // Optional keys that choose the architecture: absent means the released value; any other value is refused.
  const std::pair<const char*, const char*> released_strings[] = {
      {"pos_emb_type", "divided_fixed"}, {"pos_emb_interpolation_mode", "bilinear"}, {"norm_type", "rmsnorm"},
      {"mlp_type", "mlp2"},           {"activation_func", "gelu_pytorch_tanh"},     {"merge_type", "sd2_tpool"},
      {"mm_projector_type", "patchmergerv2"}, {"projector_hidden_act", "gelu"}};
  for (const auto& [key, released] : released_strings)
    if (r.has(key)) {
      const std::string got = r.req_str(key);
      if (r.status().is_ok() && got != released)
        return unsupported(label + ": key '" + key + "': '" + got + "' (only the released '" + released +
                           "' is implemented)");
    }
  for (const char* key : {"attn_bias", "linear_bias", "patch_embed_proj_bias"})
    if (r.opt_bool(key, false))
      return unsupported(label + ": key '" + key + "': true (the released tower has no biases)");
  KESTREL_RETURN_IF_ERROR(r.status());
  if (!(v.projector_ln_eps > 0.0f && v.projector_ln_eps < 1.0f))
    return invalid_argument(label + ": key 'projector_ln_eps': must be in (0, 1)");
  if (!j.contains("merge_kernel_size") || !j["merge_kernel_size"].is_array() || j["merge_kernel_size"].size() != 2 ||
      !j["merge_kernel_size"][0].is_number_integer() || !j["merge_kernel_size"][1].is_number_integer())
    return invalid_argument(label + ": key 'merge_kernel_size': must be a list of two integers");
  v.merge_h = j["merge_kernel_size"][0].get<int>();
  v.merge_w = j["merge_kernel_size"][1].get<int>();
  KESTREL_RETURN_IF_ERROR(config_detail::check_bounds(label, {{"vt_num_hidden_layers", v.num_layers, 1, 1024},    {"vt_hidden_size", v.hidden, 1, 1 << 16},
                          {"vt_intermediate_size", v.intermediate, 1, 1 << 18}, {"vt_num_attention_heads", v.num_heads, 1, 1024},
                          {"qkv_hidden_size", v.qkv_hidden, 1, 1 << 16},        {"patch_size", v.patch_size, 1, 1024},
                          {"init_pos_emb_height", v.pos_emb_height, 1, 4096},   {"init_pos_emb_width", v.pos_emb_width, 1, 4096},
                          {"merge_kernel_size", v.merge_h, 1, 16},              {"merge_kernel_size", v.merge_w, 1, 16},
                          {"mm_hidden_size", v.mm_hidden, 1, 1 << 16},          {"text_hidden_size", v.text_hidden, 1, 1 << 18}}));
  if (v.qkv_hidden % v.num_heads != 0)
    return invalid_argument(label + ": qkv_hidden_size " + std::to_string(v.qkv_hidden) +
                            " is not a multiple of vt_num_attention_heads " + std::to_string(v.num_heads));
  if (v.mm_hidden != v.hidden)
    return unsupported(label + ": mm_hidden_size " + std::to_string(v.mm_hidden) + " differs from vt_hidden_size " +
                       std::to_string(v.hidden) + " (the released projector merges the tower's own width)");
  return v;
}

std::vector<VisionTensor> vision_tensors(const VisionConfig& v) {
  const int64_t hid = v.hidden, ps = v.patch_size, merged = v.merged_width();
  std::vector<VisionTensor> out;
  auto add = [&](std::string name, std::vector<int64_t> shape) { out.push_back({std::move(name), DType::kBF16, std::move(shape)}); };
  add("vision_tower.patch_embed.proj.weight", {hid, 3, ps, ps});  // Conv2d 3 -> hid, kernel = stride = patch
  add("vision_tower.patch_embed.pos_emb.weight", {v.pos_emb_height, v.pos_emb_width, hid});
  for (int i = 0; i < v.num_layers; ++i) {
    const std::string p = "vision_tower.encoder.blocks." + std::to_string(i) + ".";
    add(p + "norm0.weight", {hid});
    add(p + "norm1.weight", {hid});
    add(p + "wqkv.weight", {3 * int64_t{v.qkv_hidden}, hid});
    add(p + "wo.weight", {hid, v.qkv_hidden});
    add(p + "mlp.fc0.weight", {v.intermediate, hid});
    add(p + "mlp.fc1.weight", {hid, v.intermediate});
  }
  add("vision_tower.encoder.final_layernorm.weight", {hid});
  add("mm_projector.proj.0.weight", {merged, merged});
  add("mm_projector.proj.2.weight", {v.text_hidden, merged});
  add("mm_projector.post_norm.weight", {v.text_hidden});
  return out;
}

bool is_vision_tensor_name(const std::string& name) {
  return name.rfind("vision_tower.", 0) == 0 || name.rfind("mm_projector.", 0) == 0;
}

Result<VisionTensorCount> check_vision_tensors(Checkpoint& ck, const std::string& vision_config_json,
                                               int text_hidden_size) {
  std::vector<std::string> present;
  for (const auto& n : ck.names())
    if (is_vision_tensor_name(n)) present.push_back(n);
  VisionTensorCount count;
  if (present.empty()) return count;
  const std::string cfg_path = ck.dir() + "/config.json";
  if (vision_config_json.empty())
    return corrupt(ck.file_of(present.front()) + ": tensor '" + present.front() +
                   "' belongs to a vision tower, but " + cfg_path + " has no vision_config");
  auto v = parse_vision_config(vision_config_json, cfg_path);
  if (!v) return v.error();
  if (v->text_hidden != text_hidden_size)
    return invalid_argument(cfg_path + " vision_config: key 'text_hidden_size': " + std::to_string(v->text_hidden) +
                            " differs from the text model's hidden_size " + std::to_string(text_hidden_size));
  const auto expected = vision_tensors(*v);
  std::set<std::string> names;
  for (const auto& t : expected) names.insert(t.name);
  for (const auto& n : present)
    if (!names.count(n))
      return corrupt(ck.file_of(n) + ": unknown vision tensor '" + n + "' (not in the MoonViT3d + projector layout of " +
                     std::to_string(v->num_layers) + " blocks that vision_config describes)");
  for (const auto& t : expected) {
    if (!ck.contains(t.name))
      return corrupt(ck.dir() + ": missing tensor '" + t.name + "': the checkpoint has " + std::to_string(present.size()) +
                     " of the vision tower's " + std::to_string(expected.size()) + " tensors");
    KESTREL_RETURN_IF_ERROR(ck.expect(t.name, {t.dtype}, t.shape));
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    count.params += n;
  }
  count.tensors = static_cast<int64_t>(expected.size());
  return count;
}

}  // namespace kestrel
