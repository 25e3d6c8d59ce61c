// AdamW with folded gradient clipping against the double-precision references
// (ops/ref/adamw_ref.h: clip_grad_norm then adamw_step), over two steps with different
// gradients: clipping active, inactive and off, and loss-scaled gradients (grad_scale != 1).
// The global norm comes from ops::global_l2_norm on the GPU, as in training.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "ops/adamw.h"
#include "ops/elementwise.h"
#include "ops/ref/adamw_ref.h"
#include "support/gpu_buffers.h"

namespace forja::test {
namespace {

class AdamwTest : public GpuBufferTest {
 protected:
  AdamwTest() : GpuBufferTest(3) {}
  // |got - want| <= rtol * scale + atol, element by element, with scale = |want| or, where the
  // value is a sum that may cancel, the sum of the magnitudes of its terms.
  static void expect_close(const char* what, const std::vector<float>& got, const std::vector<double>& want, double rtol,
                           double atol, const std::vector<double>* scale = nullptr) {
    ASSERT_EQ(got.size(), want.size());
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double s = scale != nullptr ? (*scale)[i] : std::abs(want[i]);
      if (!(std::abs(got[i] - want[i]) <= rtol * s + atol) && bad++ < 5)
        ADD_FAILURE() << what << " element " << i << ": " << got[i] << " vs " << want[i];
    }
    EXPECT_EQ(bad, 0u) << what;
  }
};

struct Case {
  const char* name;
  float max_grad_norm;  // relative to the gradients' norm (about 180 for n = 100003 in [-1, 1])
  float loss_scale;     // the stored gradients are loss_scale times the true ones
};

TEST_F(AdamwTest, TwoStepsMatchReference) {
  const uint64_t n = 100003;
  for (Case c : {Case{"clipping active", 0.3f, 1.0f}, Case{"clipping inactive", 1e4f, 1.0f},
                 Case{"clipping off", 0.0f, 1.0f}, Case{"loss-scaled, clipping active", 0.3f, 1024.0f},
                 Case{"loss-scaled, clipping inactive", 1e4f, 1024.0f}}) {
    SCOPED_TRACE(c.name);
    ops::AdamwParams p{0.05f, 0.9f, 0.999f, 1e-6f, 0.1f, c.max_grad_norm, 1.0f / c.loss_scale, 1};
    auto param = random(n, -1.0f, 1.0f);
    auto gp = upload(param), gm = upload(std::vector<float>(n, 0.0f)), gv = upload(std::vector<float>(n, 0.0f));
    auto gnorm = upload({std::nanf("")});
    std::vector<double> rp(param.begin(), param.end()), rm(n, 0.0), rv(n, 0.0);
    std::vector<double> m_terms(n, 0.0);  // beta1 |m| + (1 - beta1) |g|: m's scale where it cancels
    for (uint32_t step = 1; step <= 2; ++step) {
      // Gradients with a spread of magnitudes, some tiny (where eps matters).
      auto grad = random(n, -1.0f, 1.0f);
      for (size_t i = 0; i < n; i += 7) grad[i] *= 1e-4f;
      for (auto& g : grad) g *= c.loss_scale;
      auto gg = upload(grad);
      ops::global_l2_norm(ctx(), {{gg, n}}, gnorm);
      p.step = step;
      ops::adamw_step(ctx(), gp, gg, gm, gv, n, gnorm, p);
      EXPECT_EQ(result(gg, n), grad) << "the gradients changed";

      std::vector<double> g(n);
      for (size_t i = 0; i < n; ++i) g[i] = double(grad[i]) * double(p.grad_scale);
      if (c.max_grad_norm > 0) {
        double* ptr = g.data();
        const int64_t size = int64_t(n);
        ref::clip_grad_norm(&ptr, &size, 1, c.max_grad_norm);
      }
      for (size_t i = 0; i < n; ++i) m_terms[i] = p.beta1 * m_terms[i] + (1.0 - p.beta1) * std::abs(g[i]);
      ref::adamw_step(rp.data(), rm.data(), rv.data(), g.data(), int64_t(n), step, p.lr, p.beta1, p.beta2, p.eps,
                      p.weight_decay);
      SCOPED_TRACE("step " + std::to_string(step));
      expect_close("param", result(gp, n), rp, 1e-5, 1e-6);
      expect_close("m", result(gm, n), rm, 1e-5, 0.0, &m_terms);
      expect_close("v", result(gv, n), rv, 1e-5, 0.0);
    }
  }
}

TEST_F(AdamwTest, RejectsBadArguments) {
  auto b = upload(std::vector<float>(8, 0.0f));
  const ops::AdamwParams ok{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, 1.0f, 1};
  EXPECT_THROW(ops::adamw_step(ctx(), b, b, b, b, 1000, b, ok), std::logic_error);
  ops::AdamwParams step0 = ok;
  step0.step = 0;
  EXPECT_THROW(ops::adamw_step(ctx(), b, b, b, b, 8, b, step0), std::logic_error);
}

}  // namespace
}  // namespace forja::test
