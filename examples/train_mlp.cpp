// Data-parallel SGD of a small multilayer perceptron on p ranks, its gradients reduced
// through cgx::layerwise_plan (library defaults: bucket 1024, stochastic rounding,
// one-dimensional and small layers uncompressed): fp32 (uncompressed), every bit width
// 1..8 with and without error feedback, and CGX's adaptive bit widths. Plain C++ on
// host buffers; the data (a nonlinear classification task: 10 classes, each a mixture
// of 4 Gaussian blobs in 32 dimensions) is generated in the program, the same on every
// rank.
//
//   mpirun -np 4 ./train_mlp            # loss per epoch, a summary table, the width sweep
//   mpirun -np 4 ./train_mlp --widths 1,2 --epochs 4 --no-check
//   mpirun -np 4 ./train_mlp --hidden 512 --momentum 0 --lr 0.1 --batch 16
//                                       # one hidden layer of 512, plain SGD, global batch 64
//
// Every configuration starts from the same weights and sees the same batches; only the
// reduction differs. The program checks (exit status 1 otherwise, unless --no-check):
// fp32 finite; 4-bit and adaptive within 1 percentage point of fp32's held-out
// accuracy; at every width, error feedback finite (every epoch's training loss and the
// held-out loss) and at most 1 point below the same width without it; and 2-bit with
// error feedback closer to fp32 than 2-bit without it (held-out accuracy; on a tie,
// held-out loss).
#include <cgx/cgx.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int inputs = 32;
constexpr int classes = 10;
/// Widths of the network: inputs, hidden layers (--hidden), classes. Set once in main.
std::vector<int> dims = {inputs, 128, 64, 64, classes};
int n_layers() { return static_cast<int>(dims.size()) - 1; }

struct dataset {
  std::vector<float> x;  // samples x dims[0]
  std::vector<int> y;
  std::size_t size() const { return y.size(); }
};

/// 10 classes, 4 blobs each; the blobs of different classes interleave, so no linear
/// model separates them. Same on every rank (fixed seed).
void make_data(std::size_t n_train, std::size_t n_test, float noise, dataset& train, dataset& test) {
  std::mt19937_64 g(20221107);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int blobs = 4, d = inputs;
  std::vector<float> centres(static_cast<std::size_t>(classes * blobs * d));
  for (float& c : centres) c = 1.1f * nd(g);
  auto fill = [&](dataset& s, std::size_t n) {
    s.x.resize(n * d);
    s.y.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const int c = static_cast<int>(g() % classes), b = static_cast<int>(g() % blobs);
      s.y[i] = c;
      const float* ctr = &centres[static_cast<std::size_t>((c * blobs + b) * d)];
      for (int k = 0; k < d; ++k) s.x[i * d + k] = ctr[k] + noise * nd(g);
    }
  };
  fill(train, n_train);
  fill(test, n_test);
}

/// Offsets of W_k (in x out, row-major: W[i * out + o]) and b_k in the fused buffer.
struct param_layout {
  std::vector<std::size_t> w, b;
  std::size_t total = 0;
  param_layout() : w(dims.size() - 1), b(dims.size() - 1) {
    for (int k = 0; k < n_layers(); ++k) {
      w[k] = total;
      total += static_cast<std::size_t>(dims[k]) * dims[k + 1];
      b[k] = total;
      total += static_cast<std::size_t>(dims[k + 1]);
    }
  }
  std::vector<cgx::layer> layers() const {
    std::vector<cgx::layer> ls;
    for (int k = 0; k < n_layers(); ++k) {
      ls.push_back({w[k], static_cast<std::size_t>(dims[k]) * dims[k + 1], false});
      ls.push_back({b[k], static_cast<std::size_t>(dims[k + 1]), true});
    }
    return ls;
  }
};

/// Dot product with 8 independent partial sums, so that the compiler vectorizes it.
inline float dot(const float* a, const float* b, int n) {
  float acc[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  for (float v : acc) s += v;
  return s;
}

/// The MLP's forward and backward passes over one batch; activations kept per layer.
struct mlp {
  param_layout L;
  std::vector<std::vector<float>> act = std::vector<std::vector<float>>(dims.size()),
                                  delta = std::vector<std::vector<float>>(dims.size());

  /// Mean cross-entropy of the batch; with grad: accumulates d(loss)/d(params) into g
  /// (zeroed by the caller) for a loss averaged over `norm` samples.
  double run(const float* p, const float* x, const int* y, int batch, float* g, double norm, int* correct) {
    act[0].assign(x, x + static_cast<std::size_t>(batch) * dims[0]);
    const int n_layers = ::n_layers();
    for (int k = 0; k < n_layers; ++k) {
      const int in = dims[k], out = dims[k + 1];
      auto& a = act[k + 1];
      a.assign(static_cast<std::size_t>(batch) * out, 0.0f);
      const float* W = p + L.w[k];
      const float* b = p + L.b[k];
      for (int s = 0; s < batch; ++s) {
        float* z = &a[static_cast<std::size_t>(s) * out];
        for (int o = 0; o < out; ++o) z[o] = b[o];
        const float* ai = &act[k][static_cast<std::size_t>(s) * in];
        for (int i = 0; i < in; ++i) {
          const float v = ai[i];
          const float* wr = W + static_cast<std::size_t>(i) * out;
          for (int o = 0; o < out; ++o) z[o] += v * wr[o];
        }
        if (k + 1 < n_layers)
          for (int o = 0; o < out; ++o) z[o] = z[o] > 0 ? z[o] : 0.0f;
      }
    }
    // Softmax cross-entropy.
    double loss = 0;
    auto& d = delta[n_layers];
    d.assign(static_cast<std::size_t>(batch) * classes, 0.0f);
    for (int s = 0; s < batch; ++s) {
      const float* z = &act[n_layers][static_cast<std::size_t>(s) * classes];
      const float mx = *std::max_element(z, z + classes);
      double sum = 0;
      for (int c = 0; c < classes; ++c) sum += std::exp(double(z[c] - mx));
      loss += std::log(sum) - double(z[y[s]] - mx);
      if (correct && std::max_element(z, z + classes) - z == y[s]) ++*correct;
      for (int c = 0; c < classes; ++c)
        d[static_cast<std::size_t>(s) * classes + c] =
            static_cast<float>((std::exp(double(z[c] - mx)) / sum - (c == y[s] ? 1.0 : 0.0)) / norm);
    }
    if (g == nullptr) return loss / batch;
    for (int k = n_layers - 1; k >= 0; --k) {
      const int in = dims[k], out = dims[k + 1];
      const float* W = p + L.w[k];
      float* gW = g + L.w[k];
      float* gb = g + L.b[k];
      auto& dk = delta[k + 1];
      auto& dprev = delta[k];
      if (k > 0) dprev.assign(static_cast<std::size_t>(batch) * in, 0.0f);
      for (int s = 0; s < batch; ++s) {
        const float* dz = &dk[static_cast<std::size_t>(s) * out];
        const float* ai = &act[k][static_cast<std::size_t>(s) * in];
        for (int o = 0; o < out; ++o) gb[o] += dz[o];
        for (int i = 0; i < in; ++i) {
          const float v = ai[i];
          float* gr = gW + static_cast<std::size_t>(i) * out;
          for (int o = 0; o < out; ++o) gr[o] += v * dz[o];
        }
        if (k > 0) {
          float* dp = &dprev[static_cast<std::size_t>(s) * in];
          for (int i = 0; i < in; ++i)
            dp[i] = ai[i] > 0 ? dot(W + static_cast<std::size_t>(i) * out, dz, out) : 0.0f;  // ReLU'
        }
      }
    }
    return loss / batch;
  }
};

struct config {
  std::string name;
  int bits;              // 0: fp32
  bool ef = false;       // error feedback
  bool adaptive = false;
};

struct result {
  std::vector<double> epoch_loss;
  double test_loss = 0, test_acc = 0, bytes_per_step = 0, step_s = 0, reduce_s = 0, avg_bits = 0;
  std::vector<cgx::layer_setting> final_settings;
  std::vector<double> sensitivity;
  /// Every training loss and the held-out loss are finite.
  bool finite() const {
    for (double l : epoch_loss)
      if (!std::isfinite(l)) return false;
    return std::isfinite(test_loss);
  }
};

struct options {
  int epochs = 8;
  int batch = 32;          // per rank
  std::size_t train = 8192, test = 4096;
  float lr = 0.05f, momentum = 0.9f;
  int adapt_every = 16;    // steps between adaptive re-assignments
  double target_bits = 3.5;  // adaptive: average bits over the compressed layers, at most
  float noise = 1.0f;      // standard deviation of the blobs (the task's difficulty)
  bool check = true;
  std::vector<int> widths = {1, 2, 3, 4, 5, 6, 7, 8};  // the sweep's bit widths
};

result train(const config& cfg, const options& opt, const dataset& tr, const dataset& te, int rank, int p) {
  using plan_t = cgx::layerwise_plan<float, cgx::comm::mpi>;
  param_layout L;
  const auto layers = L.layers();
  cgx::layerwise_options po;
  po.defaults = {.bits = cfg.bits, .bucket = 1024, .min_compressed = 512};
  po.error_feedback = cfg.ef;
  plan_t plan{cgx::comm::mpi{MPI_COMM_WORLD}, L.total, layers, po};
  std::optional<cgx::adaptive_bits> ad;
  if (cfg.adaptive)
    ad.emplace(layers, plan.settings(),
               cgx::adaptive_options{.min_bits = 2, .max_bits = 8, .target_bits = opt.target_bits, .clusters = 2});

  // He initialization, the same on every rank and in every configuration.
  std::vector<float> w(L.total, 0.0f), vel(L.total, 0.0f), g(L.total);
  std::mt19937_64 gen(7);
  for (int k = 0; k < n_layers(); ++k) {
    std::normal_distribution<float> nd(0.0f, std::sqrt(2.0f / dims[k]));
    for (std::size_t i = 0; i < static_cast<std::size_t>(dims[k]) * dims[k + 1]; ++i) w[L.w[k] + i] = nd(gen);
  }
  mlp net;
  result res;
  const std::size_t per_rank = tr.size() / static_cast<std::size_t>(p);
  const int steps = static_cast<int>(per_rank / static_cast<std::size_t>(opt.batch));
  std::vector<std::size_t> perm(tr.size());
  std::vector<float> bx(static_cast<std::size_t>(opt.batch) * inputs);
  std::vector<int> by(static_cast<std::size_t>(opt.batch));
  double step_time = 0, reduce_time = 0, bytes = 0;
  long long nsteps = 0;
  for (int ep = 0; ep < opt.epochs; ++ep) {
    std::iota(perm.begin(), perm.end(), std::size_t{0});
    std::shuffle(perm.begin(), perm.end(), std::mt19937_64(1000 + static_cast<unsigned>(ep)));
    double loss_sum = 0;
    for (int st = 0; st < steps; ++st) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < opt.batch; ++s) {
        const std::size_t idx = perm[static_cast<std::size_t>(rank) * per_rank + static_cast<std::size_t>(st * opt.batch + s)];
        std::memcpy(&bx[static_cast<std::size_t>(s) * inputs], &tr.x[idx * inputs], sizeof(float) * inputs);
        by[static_cast<std::size_t>(s)] = tr.y[idx];
      }
      std::fill(g.begin(), g.end(), 0.0f);
      // Loss averaged over the global batch: each rank's part is divided by p * batch.
      loss_sum += net.run(w.data(), bx.data(), by.data(), opt.batch, g.data(), double(opt.batch) * p, nullptr);
      const auto t1 = std::chrono::steady_clock::now();
      plan(g.data(), g.size());
      const auto t2 = std::chrono::steady_clock::now();
      bytes += static_cast<double>(plan.bytes_sent());
      if (ad) {
        ad->observe(g.data());  // the reduced gradient: the same on every rank
        if ((nsteps + 1) % opt.adapt_every == 0) plan.set_settings(ad->assign());
      }
      for (std::size_t i = 0; i < w.size(); ++i) {
        vel[i] = opt.momentum * vel[i] + g[i];
        w[i] -= opt.lr * vel[i];
      }
      const auto t3 = std::chrono::steady_clock::now();
      step_time += std::chrono::duration<double>(t3 - t0).count();
      reduce_time += std::chrono::duration<double>(t2 - t1).count();
      res.avg_bits += plan.average_bits();
      ++nsteps;
    }
    double l = loss_sum / steps;
    MPI_Allreduce(MPI_IN_PLACE, &l, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    res.epoch_loss.push_back(l / p);
  }
  // Held-out evaluation; the weights are the same bits on every rank (the reduction is).
  int correct = 0;
  double tl = 0;
  for (std::size_t s0 = 0; s0 < te.size(); s0 += 256) {
    const int b = static_cast<int>(std::min<std::size_t>(256, te.size() - s0));
    tl += b * net.run(w.data(), &te.x[s0 * inputs], &te.y[s0], b, nullptr, 1.0, &correct);
  }
  res.test_loss = tl / static_cast<double>(te.size());
  res.test_acc = 100.0 * correct / static_cast<double>(te.size());
  // Bytes: mean over ranks; times: the slowest rank's.
  double v[3] = {bytes / nsteps, step_time / nsteps, reduce_time / nsteps};
  MPI_Allreduce(MPI_IN_PLACE, &v[0], 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &v[1], 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  res.bytes_per_step = v[0] / p;
  res.step_s = v[1];
  res.reduce_s = v[2];
  res.avg_bits /= static_cast<double>(nsteps);
  res.final_settings = plan.settings();
  if (ad) res.sensitivity = ad->sensitivity();
  return res;
}

/// "128,64,64" -> {128, 64, 64}; empty on a malformed list.
std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  for (const char* c = s; *c;) {
    char* end = nullptr;
    const long x = std::strtol(c, &end, 10);
    if (end == c || x <= 0 || x > 1 << 16) return {};
    v.push_back(static_cast<int>(x));
    c = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end != '\0') return {};
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  options opt;
  bool ok_args = true;
  for (int i = 1; i < argc && ok_args; ++i) {
    const std::string a = argv[i];
    const bool more = i + 1 < argc;
    if (a == "--epochs" && more) opt.epochs = std::atoi(argv[++i]);
    else if (a == "--no-check") opt.check = false;
    else if (a == "--noise" && more) opt.noise = std::strtof(argv[++i], nullptr);
    else if (a == "--target" && more) opt.target_bits = std::strtod(argv[++i], nullptr);
    else if (a == "--lr" && more) opt.lr = std::strtof(argv[++i], nullptr);
    else if (a == "--momentum" && more) opt.momentum = std::strtof(argv[++i], nullptr);
    else if (a == "--batch" && more) opt.batch = std::atoi(argv[++i]);
    else if (a == "--train" && more) opt.train = std::strtoul(argv[++i], nullptr, 10);
    else if (a == "--widths" && more) {
      opt.widths = parse_list(argv[++i]);
      for (int b : opt.widths) ok_args = ok_args && b <= 8;
      ok_args = ok_args && !opt.widths.empty();
    } else if (a == "--hidden" && more) {
      const auto h = parse_list(argv[++i]);
      ok_args = !h.empty();
      dims = {inputs};
      dims.insert(dims.end(), h.begin(), h.end());
      dims.push_back(classes);
    } else ok_args = false;
  }
  if (!ok_args || opt.epochs < 1 || opt.batch < 1) {
    if (rank == 0)
      std::fprintf(stderr, "usage: %s [--epochs N] [--noise S] [--lr R] [--momentum M] [--batch B] [--train N] "
                   "[--hidden W,W,..] [--widths B,B,..] [--target BITS] [--no-check]\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  dataset tr, te;
  make_data(opt.train, opt.test, opt.noise, tr, te);
  const param_layout L;
  std::vector<config> configs = {{"fp32", 0}};
  for (int b : opt.widths) {
    configs.push_back({std::to_string(b) + "-bit", b});
    configs.push_back({std::to_string(b) + "-bit+EF", b, true});
  }
  configs.push_back({"adaptive", 4, false, true});
  if (rank == 0) {
    std::string shape;
    for (std::size_t k = 0; k < dims.size(); ++k) shape += (k ? "-" : "") + std::to_string(dims[k]);
    std::printf("train_mlp: %d ranks, MLP %s (%zu parameters, %d layers: %d weights compressed as set, "
                "%d biases uncompressed), %zu training / %zu held-out samples, %d epochs, batch %d per rank, "
                "SGD lr %.3g momentum %.2g, bucket 1024, stochastic rounding; adaptive: 2..8 bits, average <= %.2g, "
                "re-assigned every %d steps\n",
                p, shape.c_str(), L.total, 2 * n_layers(), n_layers(), n_layers(), opt.train, opt.test, opt.epochs,
                opt.batch, double(opt.lr), double(opt.momentum), opt.target_bits, opt.adapt_every);
  }
  std::vector<result> res;
  for (const auto& c : configs) res.push_back(train(c, opt, tr, te, rank, p));
  int status = 0;
  if (rank == 0) {
    const std::size_t ada = configs.size() - 1;
    std::printf("\ntraining loss per epoch\n%-12s", "config");
    for (int e = 0; e < opt.epochs; ++e) std::printf("  ep%-5d", e + 1);
    std::printf("\n");
    for (std::size_t c = 0; c < configs.size(); ++c) {
      std::printf("%-12s", configs[c].name.c_str());
      for (double l : res[c].epoch_loss) std::printf("  %7.4f", l);
      std::printf("\n");
    }
    std::printf("\n%-12s %10s %9s %10s %12s %7s %10s %11s\n", "config", "test_loss", "test_acc", "bits/value",
                "bytes/step", "ratio", "step_ms", "reduce_ms");
    for (std::size_t c = 0; c < configs.size(); ++c) {
      const result& r = res[c];
      std::printf("%-12s %10.4f %8.2f%% %10.2f %12.0f %6.2fx %10.3f %11.3f\n", configs[c].name.c_str(), r.test_loss,
                  r.test_acc, r.avg_bits, r.bytes_per_step, res[0].bytes_per_step / std::max(r.bytes_per_step, 1.0),
                  1e3 * r.step_s, 1e3 * r.reduce_s);
    }
    std::printf("(bits/value: mean over steps of the plan's bits per value, uncompressed layers at 32, "
                "metadata excluded; bytes/step: sent per rank and step)\n");
    std::printf("adaptive, final bits of the weights (0 = uncompressed):");
    for (int k = 0; k < n_layers(); ++k) std::printf(" %d", res[ada].final_settings[static_cast<std::size_t>(2 * k)].bits);
    std::printf("; sensitivities");
    for (int k = 0; k < n_layers(); ++k) std::printf(" %.3g", res[ada].sensitivity[static_cast<std::size_t>(2 * k)]);
    std::printf("\n");
    std::printf("\nwidth sweep, held-out accuracy (loss), fp32: %.2f%% (%.4f)\n%5s %18s %18s %9s\n", res[0].test_acc,
                res[0].test_loss, "bits", "plain", "error feedback", "EF-plain");
    for (std::size_t i = 0; i < opt.widths.size(); ++i) {
      const result &pl = res[1 + 2 * i], &ef = res[2 + 2 * i];
      std::printf("%5d %7.2f%% (%7.4g) %7.2f%% (%7.4g) %+8.2f%s\n", opt.widths[i], pl.test_acc, pl.test_loss,
                  ef.test_acc, ef.test_loss, ef.test_acc - pl.test_acc, ef.finite() ? "" : "  (EF non-finite)");
    }
    if (opt.check && p > 1) {
      const result& f = res[0];
      auto find = [&](const std::string& n) -> const result* {
        for (std::size_t c = 0; c < configs.size(); ++c)
          if (configs[c].name == n) return &res[c];
        return nullptr;
      };
      auto report = [&](bool ok) {
        std::printf(": %s\n", ok ? "ok" : "FAIL");
        if (!ok) status = 1;
      };
      auto within = [&](const char* n, const result& r) {
        std::printf("check: %s within 1 pp of fp32 accuracy (%.2f%% vs %.2f%%)", n, r.test_acc, f.test_acc);
        report(std::abs(r.test_acc - f.test_acc) <= 1.0);
      };
      std::printf("check: fp32 finite");
      report(f.finite());
      if (const result* b4 = find("4-bit")) within("4-bit", *b4);
      within("adaptive", res[ada]);
      for (std::size_t i = 0; i < opt.widths.size(); ++i) {
        const result &pl = res[1 + 2 * i], &ef = res[2 + 2 * i];
        std::printf("check: %d-bit+EF finite and at most 1 pp below %d-bit (%.2f%% vs %.2f%%)", opt.widths[i],
                    opt.widths[i], ef.test_acc, pl.test_acc);
        report(ef.finite() && ef.test_acc >= pl.test_acc - 1.0);
      }
      const result *b2 = find("2-bit"), *ef2 = find("2-bit+EF");
      if (b2 && ef2) {
        // Error feedback must also help where plain is off: closer to fp32 at 2 bits
        // (held-out accuracy; on a tie, held-out loss; a non-finite loss is infinitely far).
        auto gap_loss = [&](const result& r) { return r.finite() ? std::abs(r.test_loss - f.test_loss) : INFINITY; };
        const double gap_ef = std::abs(ef2->test_acc - f.test_acc), gap_2 = std::abs(b2->test_acc - f.test_acc);
        const bool by_loss = gap_ef == gap_2;
        std::printf("check: 2-bit+EF closer to fp32 than 2-bit (%s: %.4g vs %.4g)",
                    by_loss ? "held-out loss gap, accuracies tie" : "accuracy gap in pp",
                    by_loss ? gap_loss(*ef2) : gap_ef, by_loss ? gap_loss(*b2) : gap_2);
        report(by_loss ? gap_loss(*ef2) < gap_loss(*b2) : gap_ef < gap_2);
      }
    }
  }
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return status;
}
