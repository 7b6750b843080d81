// trainer_kit::cudnn_attention (include/trainer_kit/cudnn_attention.hpp): cuDNN's fused SDPA
// through its frontend's graph API, built once per shape.
#include "trainer_kit/cudnn_attention.hpp"

#include <cmath>
#include <unordered_map>

#include "tessera/backend/cuda/buffer.hpp"
#include "tessera/core/error.hpp"

#if TESSERA_HAVE_CUDNN
// The frontend loads libcudnn (and the CUDA driver and NVRTC it may need) at
// run time (meson defines NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING): the trainer
// then links and starts where cuDNN is not installed, and says so.
#include <dlfcn.h>

#include <cudnn_frontend.h>

namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;  // the frontend's handle on libcudnn (dlopen below)
}

namespace trainer_kit {
namespace fe = cudnn_frontend;

namespace {
enum uid : std::int64_t { q_uid = 1, k_uid, v_uid, scale_uid, o_uid, stats_uid, do_uid, dq_uid, dk_uid, dv_uid };

void check(const fe::error_object& e, const char* what) {
  if (!e.is_good()) throw tessera::error(std::string("cuDNN attention: ") + what + ": " + e.err_msg);
}

//! The libcudnn calls made around the graphs, looked up in the library
//! load_cudnn opens (the frontend's own wrappers for them are internal, in
//! its detail namespace, not its API).
struct cudnn_calls {
  decltype(&cudnnCreate) create = nullptr;
  decltype(&cudnnDestroy) destroy = nullptr;
  decltype(&cudnnSetStream) set_stream = nullptr;
  decltype(&cudnnGetVersion) version = nullptr;
};

//! libcudnn, loaded once (its own libraries come with it), and those calls.
const cudnn_calls& load_cudnn() {
  static cudnn_calls calls;
  static const std::string failed = [] {
    fe::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (!fe::cudnn_dlhandle) fe::cudnn_dlhandle = dlopen("libcudnn.so", RTLD_NOW | RTLD_GLOBAL);
    if (!fe::cudnn_dlhandle) {
      const char* e = dlerror();
      return std::string(e ? e : "not found");
    }
    std::string missing;
    auto find = [&]<class F>(F& f, const char* name) {
      f = reinterpret_cast<F>(dlsym(fe::cudnn_dlhandle, name));
      if (!f) missing += std::string(missing.empty() ? "" : ", ") + name;
    };
    find(calls.create, "cudnnCreate"), find(calls.destroy, "cudnnDestroy");
    find(calls.set_stream, "cudnnSetStream"), find(calls.version, "cudnnGetVersion");
    return missing.empty() ? missing : "it has no " + missing;
  }();
  if (!failed.empty()) throw tessera::error("cuDNN attention: cannot load libcudnn.so.9 (" + failed + ")");
  return calls;
}
}  // namespace

struct cudnn_attention::impl {
  int B, T, H, KV, hd;
  bool deterministic;
  const cudnn_calls& cudnn = load_cudnn();
  cudnnHandle_t handle = nullptr;
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
  tessera::cuda::buffer<std::byte> workspace;
  float scale;

  // Rows of (H + 2 KV) hd for q, k, v and their gradients; (B, T, H, hd) for y and dy.
  std::int64_t row() const { return std::int64_t(H + 2 * KV) * hd; }
  std::vector<std::int64_t> qkv_stride() const { return {row() * T, hd, row(), 1}; }
  std::vector<std::int64_t> out_stride() const { return {1LL * H * hd * T, hd, 1LL * H * hd, 1}; }
  std::vector<std::int64_t> dims() const { return {B, H, T, hd}; }
  std::vector<std::int64_t> kv_dims() const { return {B, KV, T, hd}; }

  std::shared_ptr<fe::graph::Graph> new_graph() const {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
  }
  std::shared_ptr<fe::graph::Tensor_attributes> tensor(fe::graph::Graph& g, const char* name, std::int64_t id,
                                                       std::vector<std::int64_t> stride, bool kv = false) const {
    return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_dim(kv ? kv_dims() : dims())
                        .set_stride(std::move(stride)).set_uid(id));
  }
  std::shared_ptr<fe::graph::Tensor_attributes> scale_tensor(fe::graph::Graph& g) const {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name("scale")
                        .set_dim({1, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_is_pass_by_value(true)
                        .set_uid(scale_uid)
                        .set_data_type(fe::DataType_t::FLOAT));
  }
  void build(fe::graph::Graph& g) {
    check(g.validate(), "validate");
    check(g.build_operation_graph(handle), "build_operation_graph");
    check(g.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
    check(g.check_support(handle), "check_support");
    check(g.build_plans(handle), "build_plans");
  }

  impl(int B_, int T_, int H_, int KV_, int hd_, bool det)
      : B(B_), T(T_), H(H_), KV(KV_), hd(hd_), deterministic(det), scale(float(1.0 / std::sqrt(double(hd_)))) {
    if (const cudnnStatus_t rc = cudnn.create(&handle); rc != CUDNN_STATUS_SUCCESS)
      throw tessera::error("cuDNN attention: cudnnCreate failed (status " + std::to_string(int(rc)) + ")");
    try {
      fwd = new_graph();
      {
        auto& g = *fwd;
        auto q = tensor(g, "q", q_uid, qkv_stride()), k = tensor(g, "k", k_uid, qkv_stride(), true),
             v = tensor(g, "v", v_uid, qkv_stride(), true);
        auto opt = fe::graph::SDPA_attributes().set_name("attention").set_generate_stats(true).set_causal_mask(true)
                       .set_attn_scale(scale_tensor(g));
        auto [o, stats] = g.sdpa(q, k, v, opt);
        o->set_output(true).set_dim(dims()).set_stride(out_stride()).set_uid(o_uid);
        stats->set_output(true).set_data_type(fe::DataType_t::FLOAT).set_dim({B, H, T, 1})
            .set_stride({1LL * H * T, T, 1, 1}).set_uid(stats_uid);
        build(g);
      }
      bwd = new_graph();
      {
        auto& g = *bwd;
        auto q = tensor(g, "q", q_uid, qkv_stride()), k = tensor(g, "k", k_uid, qkv_stride(), true),
             v = tensor(g, "v", v_uid, qkv_stride(), true), o = tensor(g, "o", o_uid, out_stride()),
             dO = tensor(g, "do", do_uid, out_stride());
        auto stats = g.tensor(fe::graph::Tensor_attributes().set_name("stats").set_dim({B, H, T, 1})
                                  .set_stride({1LL * H * T, T, 1, 1}).set_uid(stats_uid)
                                  .set_data_type(fe::DataType_t::FLOAT));
        auto opt = fe::graph::SDPA_backward_attributes().set_name("attention_backward").set_causal_mask(true)
                       .set_attn_scale(scale_tensor(g)).set_deterministic_algorithm(deterministic);
        auto [dq, dk, dv] = g.sdpa_backward(q, k, v, o, dO, stats, opt);
        dq->set_output(true).set_dim(dims()).set_stride(qkv_stride()).set_uid(dq_uid);
        dk->set_output(true).set_dim(kv_dims()).set_stride(qkv_stride()).set_uid(dk_uid);
        dv->set_output(true).set_dim(kv_dims()).set_stride(qkv_stride()).set_uid(dv_uid);
        build(g);
      }
      std::int64_t ws = 0, wb = 0;
      check(fwd->get_workspace_size(ws), "get_workspace_size");
      check(bwd->get_workspace_size(wb), "get_workspace_size");
      workspace = tessera::cuda::buffer<std::byte>(std::size_t(std::max<std::int64_t>({ws, wb, 0})));
    } catch (const tessera::error&) {
      cudnn.destroy(handle);
      throw;
    } catch (const std::exception& e) {
      cudnn.destroy(handle);
      throw tessera::error(std::string("cuDNN attention: ") + e.what());
    }
  }
  ~impl() {
    if (handle) cudnn.destroy(handle);
  }
  void run(const fe::graph::Graph& g, std::unordered_map<std::int64_t, void*>& pack, cudaStream_t s) {
    if (cudnn.set_stream(handle, s) != CUDNN_STATUS_SUCCESS)
      throw tessera::error("cuDNN attention: cudnnSetStream failed");
    pack[scale_uid] = &scale;
    check(g.execute(handle, pack, workspace.data()), "execute");
  }
};

bool cudnn_attention::compiled() noexcept { return true; }
std::string cudnn_attention::version() {
  std::size_t v = 0;
  try {
    v = load_cudnn().version();
  } catch (const std::exception& e) {
    return std::string("cuDNN not loaded: ") + e.what();
  }
  return "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) +
         ", frontend " + std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." + std::to_string(CUDNN_FRONTEND_MINOR_VERSION) +
         "." + std::to_string(CUDNN_FRONTEND_PATCH_VERSION);
}
cudnn_attention::cudnn_attention(int B, int T, int H, int KV, int hd, bool deterministic)
    : p_(std::make_unique<impl>(B, T, H, KV, hd, deterministic)) {}
cudnn_attention::~cudnn_attention() = default;
int cudnn_attention::batch() const noexcept { return p_->B; }
int cudnn_attention::seq() const noexcept { return p_->T; }
std::size_t cudnn_attention::workspace_bytes() const noexcept { return p_->workspace.size(); }

void cudnn_attention::forward(const void* qkv, void* y, float* stats, cudaStream_t s) const {
  auto* base = static_cast<std::byte*>(const_cast<void*>(qkv));
  const std::size_t Q = std::size_t(p_->H) * std::size_t(p_->hd) * 2, K = std::size_t(p_->KV) * std::size_t(p_->hd) * 2;
  std::unordered_map<std::int64_t, void*> pack{{q_uid, base}, {k_uid, base + Q}, {v_uid, base + Q + K},
                                               {o_uid, y}, {stats_uid, stats}};
  p_->run(*p_->fwd, pack, s);
}

void cudnn_attention::backward(const void* dy, const void* qkv, const void* y, const float* stats, void* dqkv,
                               cudaStream_t s) const {
  auto* base = static_cast<std::byte*>(const_cast<void*>(qkv));
  auto* dbase = static_cast<std::byte*>(dqkv);
  const std::size_t Q = std::size_t(p_->H) * std::size_t(p_->hd) * 2, K = std::size_t(p_->KV) * std::size_t(p_->hd) * 2;
  std::unordered_map<std::int64_t, void*> pack{
      {q_uid, base}, {k_uid, base + Q}, {v_uid, base + Q + K}, {o_uid, const_cast<void*>(y)},
      {do_uid, const_cast<void*>(dy)}, {stats_uid, const_cast<float*>(stats)}, {dq_uid, dbase},
      {dk_uid, dbase + Q}, {dv_uid, dbase + Q + K}};
  p_->run(*p_->bwd, pack, s);
}

}  // namespace trainer_kit

#else  // no cuDNN in this build

namespace trainer_kit {
struct cudnn_attention::impl {};
bool cudnn_attention::compiled() noexcept { return false; }
std::string cudnn_attention::version() { return "not built (meson found no cuDNN with its frontend headers)"; }
cudnn_attention::cudnn_attention(int, int, int, int, int, bool) {
  throw tessera::error("this build has no cuDNN (meson found no cudnn.h, libcudnn and the frontend's "
                       "cudnn_frontend.h; scripts/setup installs the frontend with pip)");
}
cudnn_attention::~cudnn_attention() = default;
int cudnn_attention::batch() const noexcept { return 0; }
int cudnn_attention::seq() const noexcept { return 0; }
std::size_t cudnn_attention::workspace_bytes() const noexcept { return 0; }
void cudnn_attention::forward(const void*, void*, float*, cudaStream_t) const {}
void cudnn_attention::backward(const void*, const void*, const void*, const float*, void*, cudaStream_t) const {}
}  // namespace trainer_kit

#endif
