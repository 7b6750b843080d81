// tessera-plan: what a configuration needs and how fast it runs, before anything is allocated.
//
//   tessera-plan memory    MODEL --gpus N [CONFIG] [--gpu-memory GiB] [--json]
//   tessera-plan memory    --model gpt2|gpt2-medium|gpt2-large|gpt2-xl|gpt --batch B --gpus N [CONFIG] (tessera-gpt)
//   tessera-plan memory    --model llama3.2-1b|llama3.2-3b|llama3.1-8b|llama --batch B --gpus N [CONFIG] (tessera-llama)
//   tessera-plan predict   MODEL --gpus N [CONFIG] [--topology FILE] [--json]
//   tessera-plan sweep     MODEL --tokens-per-gpu T [--gpus-list 8,...,4096] [--shard-groups 8,64] [--topology FILE]
//                          [--json-out FILE]
//   tessera-plan best      MODEL --gpus N --gpu-memory GiB [--topology FILE] [--json]
//   tessera-plan calibrate --collectives F.json... --train F.json... [-o FILE]
//   tessera-plan validate  [--results DIR] [--topology FILE] [--json]
//   tessera-plan collective --op OP [--bytes B] [--gpus-list ...] [--topology FILE]
//
// MODEL: the reference model (--layers L --d D --ctx K --tokens T, as
// tessera-mlp-lm) or --units FILE (a JSON list of {name, params,
// flops_per_token, activation_bytes_per_token}). CONFIG: --wrapper,
// --strategy, --shard-group S --outer no_shard|optim, --precision, --wire,
// --accum, --gather-buffers, --recompute-gelu, --lend-grad-shards,
// --copy-engine-gathers, --offload-optimizer, --deterministic, --cuda-graphs.
//
// Memory is the library's own plan (tessera/plan/memory.hpp, equal byte for
// byte to what a run allocates) plus the trainer's activations: the total is
// the estimate tessera-mlp-lm prints for the same flags. Time is the
// schedule the engine issues (tessera/plan/schedule.hpp) over the
// collectives' cost model (tessera/plan/cost.hpp), on a topology fitted to
// this machine's measurements (calibrate) or published figures.
// Exit codes: 2 bad input, 3 (memory, predict) does not fit --gpu-memory,
// 1 (validate) a row off by more than its bound, (best) nothing fits.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>


#include "commands.hpp"

namespace {

using namespace plan_cli;

void add_model(CLI::App* a, options& o, std::string& units) {
  a->add_option("--layers", o.layers)->check(CLI::Range(0, 1 << 12));
  a->add_option("--d", o.d, "model width (a multiple of --ctx)")->check(CLI::Range(1, 1 << 16));
  a->add_option("--ctx", o.ctx)->check(CLI::Range(1, 1 << 12));
  a->add_option("--tokens", o.tokens, "global batch in tokens per step")->check(CLI::Range(1L, 1L << 40));
  a->add_option("--units", units, "a JSON list of units {name, params, flops_per_token, activation_bytes_per_token} "
                                  "instead of the reference model");
}

void add_config(CLI::App* a, options& o) {
  a->add_option("--accum", o.accum, "micro-batches per step")->check(CLI::Range(1, 1 << 20));
  a->add_option("--shard-group", o.shard_group, "ranks per shard group of a mesh (0: the whole world)")
      ->check(CLI::Range(0, 1 << 20));
  a->add_option("--outer", o.outer, "across the mesh's replica groups: no_shard (HSDP) or optim (HFSDP)")
      ->check(CLI::IsMember({"no_shard", "optim"}));
  a->add_option("--wrapper", o.wrapper)->check(CLI::IsMember({"ddp", "fsdp", "fsdp2"}));
  a->add_option("--strategy", o.strategy)
      ->check(CLI::IsMember({"no_shard", "optim", "optim_grads", "optim_grads_params"}));
  a->add_option("--precision", o.precision, "fp32, bf16, or fp8 (bf16's, with the host nets' fp8 code buffers: --model gpt|llama)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp8"}));
  a->add_option("--wire", o.wire, "dtype gradients are reduced in (bf16: with --precision bf16)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  a->add_option("--gather-buffers", o.gather_buffers)->check(CLI::Range(1, 1 << 16));
  a->add_flag("--recompute-gelu", o.recompute_gelu);
  a->add_flag("--lend-grad-shards", o.lend_grad_shards,
              "gradient shards in the CUDA trainer's activations (wrapper_options::lend_grad_shards)");
  a->add_flag("--copy-engine-gathers", o.copy_engine_gathers, "all-gathers on copy engines (take no SMs)");
  trainer_kit::add_offload_options(*a, o.offload, o.offload_update);
  a->add_option("--backend", o.backend, "whose activations: cuda (the GPU trainer) or host")
      ->check(CLI::IsMember({"cuda", "host"}));
  a->add_flag("--deterministic", o.deterministic, "exact_reduction with fixed micro-batches (the trainer's --deterministic)");
  a->add_option("--cuda-graphs", o.cuda_graphs,
                "the trainer's --cuda-graphs (default: its own, auto in tessera-mlp-lm, off in tessera-gpt): a step "
                "graph holds every micro-batch's tokens at once")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  a->add_option("--micro-tokens", o.micro_tokens, "--deterministic: tokens per micro-batch")->check(CLI::Range(1L, 1L << 30));
}

int print_memory(const options& o, const estimate& e) {
  const std::size_t total = e.total();
  const double limit = o.gpu_memory_gib * double(1ull << 30);
  const bool fits = limit <= 0 || double(total) <= limit;
  const int S = o.shard_group > 0 ? o.shard_group : o.gpus, R = o.gpus / S;
  if (o.json) {
    nlohmann::json j{{"params", e.params},
                     {"gpus", o.gpus},
                     {"shard_group", S},
                     {"replicas", R},
                     {"outer", o.outer},
                     {"wrapper", o.wrapper},
                     {"strategy", o.strategy},
                     {"precision", o.precision},
                     {"wire", o.wire},
                     {"backend", o.backend},
                     {"tokens_per_rank", e.tokens_per_rank},
                     {"compute_weights_bytes", e.m.model.compute_weights},
                     {"main_weights_bytes", e.m.model.main_weights},
                     {"grads_bytes", e.m.model.grads},
                     {"gathered_buffers_bytes", e.m.model.gathered_buffers},
                     {"reduction_buffers_bytes", e.m.model.reduction_buffers},
                     {"model_state_bytes", e.m.model.total() + e.own},
                     {"own_lent_shard_bytes", e.own},
                     {"optimizer_state_bytes", e.m.optimizer},
                     {"activations_bytes", e.act},
                     {"blas_workspace_bytes", e.blas},
                     {"total_bytes", total},
                     {"offloaded_bytes", e.m.host_total()},
                     {"fits", fits}};
    if (limit > 0) j["gpu_memory_bytes"] = limit;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("tessera-plan: %zu parameters, %s / %s / %s on %d rank%s (mesh %d x %d, outer %s), %zu tokens per "
                "rank and micro-batch, %s backend\n",
                e.params, o.wrapper.c_str(), o.strategy.c_str(), o.precision.c_str(), o.gpus, o.gpus == 1 ? "" : "s",
                R, S, o.outer.c_str(), e.tokens_per_rank, o.backend.c_str());
    std::printf("  compute weights   %12.2f MiB\n  main weights      %12.2f MiB\n  gradients         %12.2f MiB\n"
                "  gathered units    %12.2f MiB\n  reduction buffers %12.2f MiB\n  shards not lent   %12.2f MiB\n"
                "  optimizer state   %12.2f MiB\n"
                "  activations       %12.2f MiB\n  BLAS workspace    %12.2f MiB\n  total per rank    %12.2f MiB%s\n"
                "  offloaded (host)  %12.2f MiB\n",
                mib(e.m.model.compute_weights), mib(e.m.model.main_weights), mib(e.m.model.grads),
                mib(e.m.model.gathered_buffers), mib(e.m.model.reduction_buffers), mib(e.own), mib(e.m.optimizer),
                mib(e.act), mib(e.blas), mib(total), limit > 0 ? (fits ? "  (fits)" : "  (does NOT fit)") : "",
                mib(e.m.host_total()));
  }
  return fits ? 0 : 3;
}

int cmd_memory(const options& o) { return print_memory(o, evaluate_or_throw(o, topology{})); }

//! tessera-gpt's memory: the model from --model and the GPT shape flags.
int cmd_gpt_memory(options& o, gpt_model& g, const CLI::App& a) {
  if (g.name == "gpt") {  // tessera-gpt's defaults where a flag is not given (the MLP's --layers / --d are shared)
    if (!a.count("--layers")) o.layers = gpt::model_shape{}.layers;
    if (!a.count("--d")) o.d = gpt::model_shape{}.d;
    g.shape.layers = o.layers, g.shape.d = o.d;
  }
  if (g.shape.vocab > 65536)  // tessera-gpt's tokens are 16-bit (llm.c's GPT-2 shards)
    throw tessera::error("--vocab " + std::to_string(g.shape.vocab) + " is over tessera-gpt's 65536 (16-bit tokens)");
  if (const std::string e = gpt::resolve_shape(g.name == "gpt" ? "" : g.name, g.shape,
                                               [&](const char* f) { return a.count(f) > 0; });
      !e.empty())
    throw tessera::error(e);
  const int S = o.shard_group > 0 ? o.shard_group : o.gpus;
  if (o.gpus % S != 0)
    throw tessera::error("--shard-group " + std::to_string(S) + " does not divide --gpus " + std::to_string(o.gpus));
  if (o.outer == "optim" && o.shard_group == 0) throw tessera::error("--outer optim needs --shard-group");
  return print_memory(o, gpt_estimate(o, g));
}

//! tessera-llama's memory: the model from --model and the shape flags (those
//! tessera-gpt shares, --heads --seq --max-seq --vocab, read through `g`).
int cmd_llama_memory(options& o, llama_model& l, const gpt_model& g, const CLI::App& a) {
  if (a.count("--keep-gelu")) throw tessera::error("--keep-gelu is tessera-gpt's; tessera-llama keeps no GELU");
  llama::model_shape& s = l.shape;  // tessera-llama's defaults where a flag is not given
  const llama::model_shape d;
  s.layers = a.count("--layers") ? o.layers : d.layers;
  s.d = a.count("--d") ? o.d : d.d;
  s.heads = a.count("--heads") ? g.shape.heads : d.heads;
  s.seq = a.count("--seq") ? g.shape.seq : d.seq;
  s.max_seq = a.count("--max-seq") ? g.shape.max_seq : d.max_seq;
  s.vocab = a.count("--vocab") ? g.shape.vocab : d.vocab;
  // The rotary flags (tessera-llama's) do not change the bytes: the planner takes none of them.
  const auto given = [&](const char* f) {
    const CLI::Option* opt = a.get_option_no_throw(f);
    return opt != nullptr && opt->count() > 0;
  };
  if (const std::string e = llama::resolve_shape(l.name == "llama" ? "" : l.name, s, given);
      !e.empty())
    throw tessera::error(e);
  const int S = o.shard_group > 0 ? o.shard_group : o.gpus;
  if (o.gpus % S != 0)
    throw tessera::error("--shard-group " + std::to_string(S) + " does not divide --gpus " + std::to_string(o.gpus));
  if (o.outer == "optim" && o.shard_group == 0) throw tessera::error("--outer optim needs --shard-group");
  return print_memory(o, llama_estimate(o, l));
}

int cmd_predict(const options& o, const topology& t) {
  const estimate e = evaluate_or_throw(o, t);
  const double limit = o.gpu_memory_gib * double(1ull << 30);
  const bool fits = limit <= 0 || double(e.total()) <= limit;
  nlohmann::json j = time_json(o, e);
  j["config"] = describe(o);
  j["gpus"] = o.gpus;
  j["params"] = e.params;
  j["tokens_per_rank"] = e.tokens_per_rank;
  j["memory_bytes"] = e.total();
  j["fits"] = fits;
  j["topology"] = t.name;
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("tessera-plan: %zu parameters, %s on %d GPUs (%d per node), %zu tokens per rank and micro-batch\n"
                "  topology          %s\n"
                "  step              %12.3f ms  (%.0f tokens/s per GPU)\n"
                "  compute alone     %12.3f ms  (forward + backward, %.0f TFLOP/s)\n"
                "  optimizer         %12.3f ms\n"
                "  collectives alone %12.3f ms  (%d per step)\n"
                "  exposed           %12.3f ms\n"
                "  memory per GPU    %12.2f MiB%s\n",
                e.params, describe(o).c_str(), o.gpus, t.gpus_per_node, e.tokens_per_rank, t.name.c_str(),
                e.time.step_us / 1e3, j["tokens_per_s_per_gpu"].get<double>(), e.time.compute_us / 1e3, t.tflops,
                e.time.optimizer_us / 1e3, e.time.comm_us / 1e3, e.time.collectives, e.time.exposed_us / 1e3,
                mib(e.total()), limit > 0 ? (fits ? "  (fits)" : "  (does NOT fit)") : "");
  }
  return fits ? 0 : 3;
}

int cmd_best(const options& base, const topology& t, const std::string& search) {
  const auto space = search == "all" ? mlp_lm::planning::search_space{}
                                     : mlp_lm::planning::trainer_space(search == "trainer-nccl");
  const mlp_lm::planning::choice c = mlp_lm::planning::choose(base, t, space);
  const double limit = base.gpu_memory_gib * double(1ull << 30);
  if (c.ranked.empty()) {
    std::fprintf(stderr, "tessera: none of %d configurations fits %.2f GiB per GPU\n", c.tried, base.gpu_memory_gib);
    return 1;
  }
  const auto row = [&](const mlp_lm::planning::scored& s) {
    nlohmann::json j = time_json(s.o, s.e);
    j["config"] = describe(s.o);
    j["flags"] = mlp_lm::planning::trainer_flags(s.o);
    j["memory_bytes"] = s.e.total();
    return j;
  };
  const auto& best = c.ranked.front();
  nlohmann::json j{{"gpus", base.gpus}, {"tried", c.tried}, {"fit", c.ranked.size()}, {"best", row(best)}, {"topology", t.name}};
  if (const auto* r = c.runner_up()) {
    j["runner_up"] = row(*r);
    j["margin"] = r->e.time.step_us / best.e.time.step_us - 1.0;
  }
  if (base.json) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("tessera-plan best: %d GPUs, %d configurations, %zu fit", base.gpus, c.tried, c.ranked.size());
  if (limit > 0) std::printf(" in %.2f GiB", base.gpu_memory_gib);
  std::printf(" (topology %s)\n", t.name.c_str());
  for (std::size_t i = 0; i < std::min<std::size_t>(c.ranked.size(), 5); ++i)
    std::printf("  %zu. %-58s %9.3f ms  %8.0f tokens/s/GPU  %9.1f MiB\n", i + 1, describe(c.ranked[i].o).c_str(),
                c.ranked[i].e.time.step_us / 1e3, double(base.tokens) / base.gpus / (c.ranked[i].e.time.step_us * 1e-6),
                mib(c.ranked[i].e.total()));
  std::printf("best: %s\n", mlp_lm::planning::trainer_flags(best.o).c_str());
  if (j.contains("margin"))
    std::printf("runner-up: %s, %.2f%% slower\n", j["runner_up"]["config"].get<std::string>().c_str(),
                100 * j["margin"].get<double>());
  return 0;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');) {
    try {
      out.push_back(std::stoi(x));
    } catch (...) {
      throw tessera::error("'" + x + "' in list '" + s + "' is not a number");
    }
    if (out.back() < 1) throw tessera::error("list '" + s + "' holds " + x + " (must be at least 1)");
  }
  if (out.empty()) throw tessera::error("empty list");
  return out;
}

// Weak scaling: the same tokens per GPU from 8 to 4096 GPUs, one line per configuration.
int cmd_sweep(const options& base, const topology& t, long tokens_per_gpu, const std::string& gpus_list,
              const std::string& groups_list, const std::string& out_path) {
  const std::vector<int> worlds = parse_list(gpus_list);
  const std::vector<int> groups = groups_list.empty() ? std::vector<int>{t.gpus_per_node} : parse_list(groups_list);
  struct line {
    std::string label, wrapper, strategy, outer;
    int group;  // 0: the whole world; else ranks per shard group
  };
  std::vector<line> lines{{"fsdp optim_grads_params (flat)", "fsdp", "optim_grads_params", "no_shard", 0}};
  for (const int g : groups) {
    lines.push_back({"fsdp optim_grads_params HSDP " + std::to_string(g) + "/group", "fsdp", "optim_grads_params", "no_shard", g});
    lines.push_back({"fsdp optim_grads_params HFSDP " + std::to_string(g) + "/group", "fsdp", "optim_grads_params", "optim", g});
  }
  lines.push_back({"fsdp optim_grads (flat)", "fsdp", "optim_grads", "no_shard", 0});
  lines.push_back({"ddp no_shard", "ddp", "no_shard", "no_shard", 0});
  nlohmann::json rows = nlohmann::json::array();
  std::printf("tessera-plan sweep: %ld tokens per GPU, topology %s\n", tokens_per_gpu, t.name.c_str());
  std::printf("%6s  %-44s %10s %14s %10s %12s %5s\n", "GPUs", "configuration", "step ms", "tokens/s/GPU", "exposed",
              "MiB/GPU", "fits");
  for (const int n : worlds)
    for (const auto& l : lines) {
      if (l.group > 0 && (l.group >= n || n % l.group != 0)) continue;
      options o = base;
      o.gpus = n, o.tokens = tokens_per_gpu * n, o.wrapper = l.wrapper, o.strategy = l.strategy, o.outer = l.outer;
      o.shard_group = l.group;
      mlp_lm::planning::check(o);
      const estimate e = evaluate_or_throw(o, t);
      const double limit = o.gpu_memory_gib * double(1ull << 30);
      const bool fits = limit <= 0 || double(e.total()) <= limit;
      nlohmann::json j = time_json(o, e);
      j["gpus"] = n, j["line"] = l.label, j["memory_bytes"] = e.total(), j["fits"] = fits;
      rows.push_back(j);
      std::printf("%6d  %-44s %10.3f %14.0f %10.3f %12.1f %5s\n", n, l.label.c_str(), e.time.step_us / 1e3,
                  j["tokens_per_s_per_gpu"].get<double>(), e.time.exposed_us / 1e3, mib(e.total()), fits ? "yes" : "no");
    }
  if (!out_path.empty()) {
    std::ofstream f(out_path);
    f << nlohmann::json{{"topology", mlp_lm::planning::to_json(t)},
                        {"model", {{"layers", base.layers}, {"d", base.d}, {"ctx", base.ctx}}},
                        {"tokens_per_gpu", tokens_per_gpu},
                        {"rows", rows}}
             .dump(1)
      << "\n";
    if (!f) throw tessera::error("cannot write '" + out_path + "'");
  }
  return 0;
}

int cmd_collective(const topology& t, const std::string& op, double bytes, const std::string& gpus_list, bool json) {
  const auto c = tessera::plan::collective_named(op);
  nlohmann::json rows = nlohmann::json::array();
  if (!json) std::printf("tessera-plan collective: %s of %.0f bytes, topology %s\n%8s %6s %12s %12s\n", op.c_str(), bytes,
                         t.name.c_str(), "GPUs", "nodes", "time us", "busbw GB/s");
  for (const int n : parse_list(gpus_list)) {
    const auto p = tessera::plan::place(t, n);
    const double us = tessera::plan::collective_us(t, c, bytes, n), bw = tessera::plan::busbw_gbs(t, c, bytes, n);
    rows.push_back({{"gpus", n}, {"nodes", p.nodes}, {"time_us", us}, {"busbw_gbs", bw}});
    if (!json) std::printf("%8d %6d %12.1f %12.1f\n", n, p.nodes, us, bw);
  }
  if (json) std::printf("%s\n", nlohmann::json{{"op", op}, {"bytes", bytes}, {"rows", rows}}.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  std::string units, topo, out, results = "bench/results", gpus_list = "8,16,32,64,128,256,512,1024,2048,4096";
  std::vector<std::string> colls, trains;
  long tokens_per_gpu = 8192;
  int gpus_per_node = 8;
  double time_bound = 0.10, mem_bound = 0.02;
  CLI::App app{"tessera-plan: memory and step time of a configuration before allocating, and the best one"};
  app.require_subcommand(1);
  CLI::App* mem = app.add_subcommand("memory", "bytes per rank: the library's own plan plus the trainer's activations");
  CLI::App* pre = app.add_subcommand("predict", "step time, tokens/s per GPU, exposed communication and memory");
  CLI::App* swp = app.add_subcommand("sweep", "weak scaling over world sizes, one line per configuration");
  CLI::App* bst = app.add_subcommand("best", "the fastest configuration that fits, the runner-up and the margin");
  CLI::App* cal = app.add_subcommand("calibrate", "fit a topology to tessera-collectives and tessera-bench-train JSON");
  CLI::App* val = app.add_subcommand("validate", "predicted against measured for every tessera-bench-train JSON");
  CLI::App* col = app.add_subcommand("collective", "the cost model of one collective over world sizes");
  std::string op = "reduce_scatter";
  double bytes = double(1ull << 33);
  col->add_option("--op", op)->check(CLI::IsMember({"all_gather", "reduce_scatter", "all_reduce", "broadcast"}));
  col->add_option("--bytes", bytes, "nccl-tests' size (default 8 GiB)")->check(CLI::PositiveNumber);
  col->add_option("--gpus-list", gpus_list, "world sizes, comma-separated");
  col->add_flag("--json", o.json);
  for (CLI::App* a : {mem, pre, swp, bst}) {
    add_model(a, o, units);
    add_config(a, o);
    a->add_option("--gpu-memory", o.gpu_memory_gib, "GiB per GPU to fit in")->check(CLI::NonNegativeNumber);
    a->add_flag("--json", o.json);
  }
  for (CLI::App* a : {mem, pre, bst}) a->add_option("--gpus", o.gpus, "ranks in all")->check(CLI::Range(1, 1 << 20));
  gpt_model g;
  llama_model l;
  mem->add_option("--model", g.name,
                  "a sequence model instead of the MLP: tessera-gpt's gpt2, gpt2-medium, gpt2-large, gpt2-xl, or gpt "
                  "(the shape from --layers --heads --d --seq --vocab); tessera-llama's llama3.2-1b, llama3.2-3b, "
                  "llama3.1-8b, or llama (the shape from the flags, --kv-heads --ffn --head-dim --tie-embeddings too)")
      ->check(CLI::IsMember({"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt", "llama3.2-1b", "llama3.2-3b",
                             "llama3.1-8b", "llama"}));
  mem->add_option("--kv-heads", l.shape.kv_heads, "--model llama: key and value heads")->check(CLI::Range(1, 1 << 10));
  mem->add_option("--ffn", l.shape.ffn, "--model llama: the SwiGLU MLP's width")->check(CLI::Range(1, 1 << 18));
  mem->add_option("--head-dim", l.shape.head_dim_, "--model llama: head dimension (default --d / --heads)")
      ->check(CLI::Range(0, 1024));
  mem->add_flag("--tie-embeddings", l.shape.tie_embeddings, "--model llama: the head is the token table");
  mem->add_option("--heads", g.shape.heads, "--model: attention heads")->check(CLI::Range(1, 1 << 10));
  mem->add_option("--seq", g.shape.seq, "--model: tokens per sequence")->check(CLI::Range(1, 1 << 16));
  mem->add_option("--max-seq", g.shape.max_seq, "--model: rows of the position table (default --seq)")
      ->check(CLI::Range(0, 1 << 16));
  mem->add_option("--vocab", g.shape.vocab, "--model: vocabulary")->check(CLI::Range(2, 1 << 24));
  mem->add_option("--batch", g.batch, "--model: sequences per micro-batch per rank")->check(CLI::Range(1, 1 << 20));
  mem->add_flag("--recompute", g.recompute, "--model: per-block activation recompute");
  mem->add_flag("--keep-gelu", g.keep_gelu, "--model: every block's GELU output kept for backward (--backend cuda)");
  for (CLI::App* a : {pre, swp, bst, val, col})
    a->add_option("--topology", topo, "a topology JSON (calibrate writes one; default: published 8xH200 figures)");
  std::string search = "all";
  bst->add_option("--search", search,
                  "all, or what tessera-mlp-lm --plan auto searches: trainer (fp32 wire, two gather buffers, no copy "
                  "engines), trainer-nccl (copy engines too)")
      ->check(CLI::IsMember({"all", "trainer", "trainer-nccl"}));
  swp->add_option("--tokens-per-gpu", tokens_per_gpu)->check(CLI::Range(1L, 1L << 30));
  swp->add_option("--gpus-list", gpus_list, "world sizes, comma-separated");
  std::string groups_list;
  swp->add_option("--shard-groups", groups_list, "shard-group sizes of the HSDP and HFSDP lines (default: one node)");
  swp->add_option("--json-out", out, "write the rows as JSON (bench/plot_plan.py draws them)");
  cal->add_option("--collectives", colls, "tessera-collectives --json files (NCCL, several world sizes)")->expected(1, -1);
  cal->add_option("--train", trains, "tessera-bench-train --json files: one GPU (compute), several (interference)")
      ->expected(1, -1)
      ->required();
  cal->add_option("--gpus-per-node", gpus_per_node)->check(CLI::Range(1, 1 << 10));
  cal->add_option("-o,--out", out, "write the topology here (default: print it)");
  std::string cal_name = "calibrated";
  cal->add_option("--name", cal_name, "the topology's name");
  val->add_option("--results", results, "a folder of JSON results")->check(CLI::ExistingDirectory);
  val->add_option("--time-bound", time_bound)->check(CLI::NonNegativeNumber);
  val->add_option("--memory-bound", mem_bound)->check(CLI::NonNegativeNumber);
  val->add_flag("--json", o.json);
  CLI11_PARSE(app, argc, argv);
  try {
    if (cal->parsed()) return cmd_calibrate(colls, trains, gpus_per_node, out, cal_name);
    if (val->parsed()) return cmd_validate(results, topo, time_bound, mem_bound, o.json);
    if (!units.empty()) o.units = mlp_lm::planning::read_units(units), o.backend = o.backend;
    const topology t = mlp_lm::planning::read_topology(topo);
    if (col->parsed()) return cmd_collective(t, op, bytes, gpus_list, o.json);
    if (swp->parsed()) return cmd_sweep(o, t, tokens_per_gpu, gpus_list, groups_list, out);
    if (mem->parsed() && g.name.rfind("llama", 0) == 0) {
      l.name = g.name, l.batch = g.batch, l.recompute = g.recompute;
      return cmd_llama_memory(o, l, g, *mem);
    }
    for (const char* f : {"--kv-heads", "--ffn", "--head-dim", "--tie-embeddings"})
      if (mem->count(f)) throw tessera::error(std::string(f) + " describes tessera-llama's model; give --model llama too");
    if (mem->parsed() && !g.name.empty()) return cmd_gpt_memory(o, g, *mem);
    for (const char* f : {"--heads", "--seq", "--max-seq", "--vocab", "--batch", "--recompute", "--keep-gelu"})
      if (mem->count(f)) throw tessera::error(std::string(f) + " describes tessera-gpt's model; give --model too");
    mlp_lm::planning::check(o);
    if (mem->parsed()) return cmd_memory(o);
    if (pre->parsed()) return cmd_predict(o, t);
    return cmd_best(o, t, search);
  } catch (const std::exception& e) {
    const std::string w = e.what();
    std::fprintf(stderr, "%s%s\n", w.rfind("tessera:", 0) == 0 ? "" : "tessera: ", w.c_str());
    return 2;
  }
}
