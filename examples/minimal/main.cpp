// The Tessera API as a newcomer meets it: a two-unit linear model y = W2 (W1 x)
// trained on a fixed target with FSDP (ZeRO-3) and AdamW, on the host backend.
// Run: mpirun -np 2 ./tessera-minimal
#include <tessera/tessera.hpp>

#include <cstdio>
#include <vector>

using namespace tessera;
using Cfg = config<optim_grads_params, fsdp, full_precision<float>, average_in_collective, backend::host>;

int main(int argc, char** argv) try {
  comm::mpi_session session(&argc, &argv);
  comm::mpi world;  // a duplicate of MPI_COMM_WORLD

  // 1. Describe the model: units of named parameters, then finalize.
  data_parallel_t<Cfg> model(world);
  const int d = 8;
  auto u1 = model.add_unit("layer1"), u2 = model.add_unit("layer2");
  auto w1 = model.add_param(u1, "w", {d, d});
  auto w2 = model.add_param(u2, "w", {d, d});
  model.finalize();

  // 2. Initial values: every rank passes the same full tensor, keeps its piece.
  std::vector<float> init(d * d);
  for (int i = 0; i < d * d; ++i) init[i] = 0.1f * float((i * 7) % 11) / 11.0f;
  model.set_param(w1, init);
  model.set_param(w2, init);
  ShardedOptimizer opt(model, adamw{.lr = 0.05, .weight_decay = 0.0}, {.clip_norm = 1.0});

  // 3. Train: minimise |W2 W1 x - t|^2 / 2 for one x, t (each rank the same sample).
  std::vector<float> x(d, 1.0f), t(d), h(d), y(d);
  for (int i = 0; i < d; ++i) t[i] = float(i) / d;
  for (int step = 0; step < 30; ++step) {
    float loss = 0;
    {  // forward
      auto s1 = model.gather(u1);
      auto W = s1.weight(w1);
      for (int i = 0; i < d; ++i) { h[i] = 0; for (int j = 0; j < d; ++j) h[i] += W[i * d + j] * x[j]; }
    }
    std::vector<float> dy(d);
    {  // forward of layer 2 and its backward (the unit stays gathered)
      auto s2 = model.gather(u2);
      auto W = s2.weight(w2);
      for (int i = 0; i < d; ++i) { y[i] = 0; for (int j = 0; j < d; ++j) y[i] += W[i * d + j] * h[j]; }
      for (int i = 0; i < d; ++i) { dy[i] = y[i] - t[i]; loss += 0.5f * dy[i] * dy[i]; }
      auto G = s2.grad(w2);
      for (int i = 0; i < d; ++i) for (int j = 0; j < d; ++j) G[i * d + j] += dy[i] * h[j];
      std::vector<float> dh(d, 0.0f);
      for (int i = 0; i < d; ++i) for (int j = 0; j < d; ++j) dh[j] += W[i * d + j] * dy[i];
      s2.reduce_grads();  // reduce-scatter starts while layer 1's backward runs
      auto s1 = model.gather(u1);
      auto G1 = s1.grad(w1);
      for (int i = 0; i < d; ++i) for (int j = 0; j < d; ++j) G1[i * d + j] += dh[i] * x[j];
      s1.reduce_grads();
    }
    const step_result r = opt.step();  // finish_grad_sync, norm, clip, AdamW, all-gather
    if (world.rank() == 0 && step % 5 == 0)
      std::printf("step %2d  loss %.5f  grad_norm %.4f\n", step, loss, r.grad_norm);
  }
  return 0;
} catch (const tessera::error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
