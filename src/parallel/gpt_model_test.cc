#include "parallel/gpt_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/gpt_test_support.h"
#include "parallel/optimizer.h"

namespace kc::parallel {
namespace {

using ::kc::parallel::testing::Cpu;
using ::kc::parallel::testing::Tokens;

ModelSpec Small(bool tied) {
  ModelSpec s;
  s.name = "grad-check";
  s.layers = 2;
  s.hidden = 8;
  s.heads = 2;
  s.ffn_hidden = 12;
  s.vocab = 11;
  s.seq_len = 5;
  s.batch_per_rank = 2;
  s.tied_embeddings = tied;
  return s;
}

class GptGradientTest : public ::testing::TestWithParam<bool> {};

// The whole model's backward against central differences of its loss, in double, for every
// parameter of every tensor.
TEST_P(GptGradientTest, EveryParameterGradientMatchesFiniteDifferences) {
  auto device = Cpu();
  const ModelSpec spec = Small(GetParam());
  auto model = Gpt<double>::Create(spec, device.get(), {});
  ASSERT_TRUE(model.ok()) << model.status();
  Gpt<double>& m = **model;
  m.InitParameters(7);
  // Larger weights than GPT-2's 0.02 so every path carries signal.
  std::mt19937 gen(3);
  std::normal_distribution<double> noise(0.0, 0.3);
  for (double& p : m.params()) p += noise(gen);
  const std::vector<int32_t> in = Tokens(m.tokens(), spec.vocab, 1);
  const std::vector<int32_t> tg = Tokens(m.tokens(), spec.vocab, 2);

  ASSERT_TRUE(m.Forward(in, tg, 1.0 / m.tokens()).ok());
  std::vector<int> order;
  ASSERT_TRUE(m.Backward(false, [&](int t) {
                 order.push_back(t);
                 return OkStatus();
               }).ok());
  // Announced once each, in the documented backward order.
  std::vector<int> want;
  const std::vector<TensorSpec> backward = ParameterTensorsBackwardOrder(spec);
  for (const TensorSpec& t : backward) {
    for (size_t i = 0; i < m.tensors().size(); ++i) {
      if (m.tensors()[i].name == t.name) want.push_back(static_cast<int>(i));
    }
  }
  EXPECT_EQ(order, want);

  const double h = 1e-5;
  for (size_t t = 0; t < m.tensors().size(); ++t) {
    std::span<double> p = m.param(static_cast<int>(t));
    std::span<double> g = m.grad(static_cast<int>(t));
    double worst = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      const double keep = p[i];
      p[i] = keep + h;
      const double up = *m.Forward(in, tg, 0);
      p[i] = keep - h;
      const double down = *m.Forward(in, tg, 0);
      p[i] = keep;
      const double numeric = (up - down) / (2 * h);
      worst = std::max(worst, std::fabs(numeric - g[i]) / std::max(1e-2, std::fabs(numeric)));
    }
    EXPECT_LT(worst, 1e-5) << m.tensors()[t].name;
  }
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, GptGradientTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Tied" : "Untied"; });

// Threads that split the batch give the gradients of one thread (up to summation order), and
// each tensor is still announced exactly once.
TEST(GptModelTest, ThreadsSplittingTheBatchGiveTheSameGradients) {
  auto device = Cpu();
  ModelSpec spec = Small(false);
  spec.batch_per_rank = 5;  // 5 sequences over 3 threads: 2, 2, 1 (uneven)
  auto one = Gpt<double>::Create(spec, device.get(), {});
  auto three = Gpt<double>::Create(spec, device.get(), {.threads = 3});
  ASSERT_TRUE(one.ok() && three.ok());
  (*one)->InitParameters(3);
  (*three)->InitParameters(3);
  const auto in = Tokens((*one)->tokens(), 11, 1), tg = Tokens((*one)->tokens(), 11, 2);
  for (bool accumulate : {false, true}) {
    const double l1 = *(*one)->Forward(in, tg, 1.0 / (*one)->tokens());
    const double l3 = *(*three)->Forward(in, tg, 1.0 / (*three)->tokens());
    EXPECT_NEAR(l1, l3, 1e-12);
    ASSERT_TRUE((*one)->Backward(accumulate, [](int) { return OkStatus(); }).ok());
    std::vector<int> announced((*three)->tensors().size(), 0);
    ASSERT_TRUE((*three)
                    ->Backward(accumulate,
                               [&](int t) {
                                 ++announced[t];
                                 return OkStatus();
                               })
                    .ok());
    EXPECT_EQ(announced, std::vector<int>(announced.size(), 1));
    for (size_t t = 0; t < announced.size(); ++t) {
      std::span<double> a = (*one)->grad(static_cast<int>(t));
      std::span<double> b = (*three)->grad(static_cast<int>(t));
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_NEAR(a[i], b[i], 1e-12) << (*one)->tensors()[t].name << "[" << i << "]";
      }
    }
  }
  // An error from on_ready stops the pass and comes back.
  ASSERT_TRUE((*three)->Forward(in, tg, 1.0).ok());
  Status s = (*three)->Backward(
      false, [](int t) { return t == 0 ? InternalError("bucket failed") : OkStatus(); });
  EXPECT_EQ(s.code(), ErrorCode::kInternal);
}

// A model split into pipeline stages computes what the whole model does: the same losses and,
// stage by stage, the same gradients (a tied wte's two copies adding up to the whole model's),
// with two micro-batches' activations held at once in two slots.
class GptStageTest : public ::testing::TestWithParam<std::tuple<bool, std::vector<int64_t>>> {};

TEST_P(GptStageTest, StagesComposeToTheWholeModel) {
  const auto& [tied, bounds] = GetParam();
  auto device = Cpu();
  ModelSpec spec = Small(tied);
  spec.layers = bounds.back();
  auto whole = Gpt<double>::Create(spec, device.get(), {});
  ASSERT_TRUE(whole.ok()) << whole.status();
  Gpt<double>& w = **whole;
  w.InitParameters(7);
  std::mt19937 gen(3);
  std::normal_distribution<double> noise(0.0, 0.3);
  for (double& p : w.params()) p += noise(gen);

  std::vector<std::unique_ptr<Gpt<double>>> stages;
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    auto stage = Gpt<double>::Create(
        spec, device.get(), {.first_layer = bounds[i], .end_layer = bounds[i + 1], .slots = 2});
    ASSERT_TRUE(stage.ok()) << stage.status();
    Gpt<double>& st = **stage;
    EXPECT_EQ(st.has_embedding(), i == 0);
    EXPECT_EQ(st.has_head(), i + 2 == bounds.size());
    // Initialisation gives a stage the whole model's values; the noise is copied over.
    st.InitParameters(7);
    auto fresh = Gpt<double>::Create(spec, device.get(), {});
    ASSERT_TRUE(fresh.ok());
    (*fresh)->InitParameters(7);
    for (size_t t = 0; t < st.tensors().size(); ++t) {
      const int g = st.global_index(static_cast<int>(t));
      EXPECT_EQ(st.tensors()[t].name, w.tensors()[static_cast<size_t>(g)].name);
      const std::span<double> mine = st.param(static_cast<int>(t));
      const std::span<double> init = (*fresh)->param(g);
      ASSERT_TRUE(std::equal(mine.begin(), mine.end(), init.begin())) << st.tensors()[t].name;
      const std::span<double> src = w.param(g);
      std::copy(src.begin(), src.end(), mine.begin());
    }
    stages.push_back(std::move(*stage));
  }

  const int64_t n = w.tokens();
  const std::vector<int32_t> in[2] = {Tokens(n, spec.vocab, 1), Tokens(n, spec.vocab, 2)};
  const std::vector<int32_t> tg[2] = {Tokens(n, spec.vocab, 3), Tokens(n, spec.vocab, 4)};
  auto ignore = [](int) { return OkStatus(); };
  double whole_loss[2];
  for (int mb = 0; mb < 2; ++mb) {
    Result<double> loss = w.Forward(in[mb], tg[mb], 1.0 / n);
    ASSERT_TRUE(loss.ok()) << loss.status();
    whole_loss[mb] = *loss;
    ASSERT_TRUE(w.Backward(mb > 0, ignore).ok());
  }

  // GPipe's order: both forwards through every stage, then both backwards.
  const size_t last = stages.size() - 1;
  for (int mb = 0; mb < 2; ++mb) {
    for (size_t i = 0; i <= last; ++i) {
      Gpt<double>& st = *stages[i];
      if (i > 0) {
        std::span<const double> out = stages[i - 1]->stage_output(mb);
        std::copy(out.begin(), out.end(), st.stage_input(mb).begin());
      }
      Result<double> loss = st.Forward(
          mb, i == 0 ? std::span<const int32_t>(in[mb]) : std::span<const int32_t>(),
          i == last ? std::span<const int32_t>(tg[mb]) : std::span<const int32_t>(), 1.0 / n);
      ASSERT_TRUE(loss.ok()) << loss.status();
      if (i == last) EXPECT_DOUBLE_EQ(*loss, whole_loss[mb]) << "micro-batch " << mb;
    }
  }
  for (int mb = 0; mb < 2; ++mb) {
    for (size_t i = last + 1; i-- > 0;) {
      Gpt<double>& st = *stages[i];
      if (i < last) {
        std::span<const double> g = stages[i + 1]->grad_input();
        std::copy(g.begin(), g.end(), st.grad_output().begin());
      }
      std::vector<int> announced;
      ASSERT_TRUE(st.Backward(mb, mb > 0, [&](int t) {
                      announced.push_back(t);
                      return OkStatus();
                    }).ok());
      std::sort(announced.begin(), announced.end());
      std::vector<int> all(st.tensors().size());
      std::iota(all.begin(), all.end(), 0);
      EXPECT_EQ(announced, all) << "stage " << i;
    }
  }

  // Every gradient as the whole model's; wte's copies add up to it.
  std::vector<double> wte(static_cast<size_t>(spec.vocab * spec.hidden), 0.0);
  for (const auto& st : stages) {
    for (size_t t = 0; t < st->tensors().size(); ++t) {
      const int g = st->global_index(static_cast<int>(t));
      const std::span<double> mine = st->grad(static_cast<int>(t));
      if (g == 0) {
        for (size_t j = 0; j < mine.size(); ++j) wte[j] += mine[j];
        continue;
      }
      const std::span<double> want = w.grad(g);
      for (size_t j = 0; j < mine.size(); ++j) {
        ASSERT_NEAR(mine[j], want[j], 1e-12 * (1 + std::abs(want[j])))
            << st->tensors()[t].name << "[" << j << "]";
      }
    }
  }
  const std::span<double> want = w.grad(0);
  for (size_t j = 0; j < wte.size(); ++j) {
    ASSERT_NEAR(wte[j], want[j], 1e-12 * (1 + std::abs(want[j]))) << "wte[" << j << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(Splits, GptStageTest,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(std::vector<int64_t>{0, 1, 2},
                                                              std::vector<int64_t>{0, 2, 3, 5},
                                                              std::vector<int64_t>{0, 3})));

// ZB-H1's split backward (input pass, then weight pass, two micro-batches in flight and the
// weight passes after both input passes) gives the whole backward's gradients, and the same
// input gradient for the previous stage.
TEST_P(GptGradientTest, SplitBackwardGivesTheWholeBackwardsGradients) {
  auto device = Cpu();
  ModelSpec spec = Small(GetParam());
  spec.layers = 3;
  for (const auto& [first, end] : {std::pair<int64_t, int64_t>{0, 3}, {1, 3}, {0, 2}, {1, 2}}) {
    auto whole = Gpt<double>::Create(
        spec, device.get(), {.threads = 2, .first_layer = first, .end_layer = end, .slots = 2});
    auto split = Gpt<double>::Create(
        spec, device.get(),
        {.threads = 2, .first_layer = first, .end_layer = end, .slots = 2, .split_backward = true});
    ASSERT_TRUE(whole.ok() && split.ok());
    Gpt<double>& w = **whole;
    Gpt<double>& s = **split;
    w.InitParameters(7);
    std::mt19937 gen(3);
    std::normal_distribution<double> noise(0.0, 0.3);
    for (double& p : w.params()) p += noise(gen);
    std::copy(w.params().begin(), w.params().end(), s.params().begin());
    const int64_t n = w.tokens();
    std::vector<int32_t> tokens[2] = {Tokens(n, spec.vocab, 1), Tokens(n, spec.vocab, 2)};
    std::vector<int32_t> targets[2] = {Tokens(n, spec.vocab, 3), Tokens(n, spec.vocab, 4)};
    std::vector<double> stage_in[2], grad_out[2];
    for (int mb = 0; mb < 2; ++mb) {
      stage_in[mb].resize(static_cast<size_t>(n * spec.hidden));
      grad_out[mb].resize(static_cast<size_t>(n * spec.hidden));
      for (double& x : stage_in[mb]) x = noise(gen);
      for (double& x : grad_out[mb]) x = noise(gen) * 0.01;
    }
    for (Gpt<double>* m : {&w, &s}) {
      for (int mb = 0; mb < 2; ++mb) {
        if (!m->has_embedding()) {
          std::copy(stage_in[mb].begin(), stage_in[mb].end(), m->stage_input(mb).begin());
        }
        ASSERT_TRUE(m->Forward(mb,
                               m->has_embedding() ? std::span<const int32_t>(tokens[mb])
                                                  : std::span<const int32_t>(),
                               m->has_head() ? std::span<const int32_t>(targets[mb])
                                             : std::span<const int32_t>(),
                               1.0 / n)
                        .ok());
      }
    }
    auto ignore = [](int) { return OkStatus(); };
    std::vector<double> whole_in[2], split_in[2];
    for (int mb = 0; mb < 2; ++mb) {
      if (!w.has_head())
        std::copy(grad_out[mb].begin(), grad_out[mb].end(), w.grad_output().begin());
      ASSERT_TRUE(w.Backward(mb, mb > 0, ignore).ok());
      if (!w.has_embedding()) whole_in[mb].assign(w.grad_input().begin(), w.grad_input().end());
    }
    for (int mb = 0; mb < 2; ++mb) {
      if (!s.has_head())
        std::copy(grad_out[mb].begin(), grad_out[mb].end(), s.grad_output().begin());
      ASSERT_TRUE(s.BackwardInput(mb).ok());
      if (!s.has_embedding()) split_in[mb].assign(s.grad_input().begin(), s.grad_input().end());
    }
    ASSERT_TRUE(s.BackwardWeight(0, false, ignore).ok());
    // A second weight pass has no input pass to follow.
    EXPECT_EQ(s.BackwardWeight(0, false, ignore).code(), ErrorCode::kFailedPrecondition);
    std::vector<int> announced;
    ASSERT_TRUE(s.BackwardInput(1).code() == ErrorCode::kFailedPrecondition);  // no forward left
    ASSERT_TRUE(s.BackwardWeight(1, true, [&](int t) {
                   announced.push_back(t);
                   return OkStatus();
                 }).ok());
    EXPECT_EQ(announced.size(), s.tensors().size());
    for (int mb = 0; mb < 2; ++mb) EXPECT_EQ(whole_in[mb], split_in[mb]) << first << "-" << end;
    for (size_t t = 0; t < w.tensors().size(); ++t) {
      const std::span<double> a = w.grad(static_cast<int>(t));
      const std::span<double> b = s.grad(static_cast<int>(t));
      for (size_t j = 0; j < a.size(); ++j) {
        ASSERT_NEAR(a[j], b[j], 1e-12 * (1 + std::abs(a[j])))
            << first << "-" << end << " " << w.tensors()[t].name << "[" << j << "]";
      }
    }
  }
  auto device2 = Cpu();
  auto plain = Gpt<double>::Create(Small(true), device2.get(), {});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->BackwardInput(0).code(), ErrorCode::kFailedPrecondition);
}

// Activation recompute keeps each layer's output only and redoes the rest in the backward: the
// same losses and gradients, bit for bit, in less memory; with stages and slots too.
TEST_P(GptGradientTest, RecomputeGivesTheSameGradientsInLessMemory) {
  auto device = Cpu();
  ModelSpec spec = Small(GetParam());
  spec.layers = 3;
  for (const auto& [first, end] : {std::pair<int64_t, int64_t>{0, 3}, {1, 3}, {0, 2}}) {
    GptOptions o{.threads = 2, .first_layer = first, .end_layer = end, .slots = 2};
    auto kept = Gpt<double>::Create(spec, device.get(), o);
    o.recompute = true;
    auto redone = Gpt<double>::Create(spec, device.get(), o);
    ASSERT_TRUE(kept.ok() && redone.ok());
    Gpt<double>& a = **kept;
    Gpt<double>& b = **redone;
    EXPECT_LT(b.activation_bytes(), a.activation_bytes());
    a.InitParameters(5);
    std::copy(a.params().begin(), a.params().end(), b.params().begin());
    const int64_t n = a.tokens();
    std::mt19937 gen(9);
    std::normal_distribution<double> noise(0.0, 0.1);
    std::vector<double> in(static_cast<size_t>(n * spec.hidden)), out(in.size());
    for (double& x : in) x = noise(gen);
    for (double& x : out) x = noise(gen);
    const std::vector<int32_t> tokens = Tokens(n, spec.vocab, 1),
                               targets = Tokens(n, spec.vocab, 2);
    double loss[2] = {0, 0};
    int i = 0;
    for (Gpt<double>* m : {&a, &b}) {
      for (int mb = 0; mb < 2; ++mb) {  // two micro-batches in flight
        if (!m->has_embedding()) std::copy(in.begin(), in.end(), m->stage_input(mb).begin());
        Result<double> l = m->Forward(
            mb, m->has_embedding() ? std::span<const int32_t>(tokens) : std::span<const int32_t>(),
            m->has_head() ? std::span<const int32_t>(targets) : std::span<const int32_t>(),
            1.0 / n);
        ASSERT_TRUE(l.ok()) << l.status();
        loss[i] += *l;
      }
      for (int mb = 0; mb < 2; ++mb) {
        if (!m->has_head()) std::copy(out.begin(), out.end(), m->grad_output().begin());
        ASSERT_TRUE(m->Backward(mb, mb > 0, [](int) { return OkStatus(); }).ok());
      }
      ++i;
    }
    EXPECT_EQ(loss[0], loss[1]);
    if (!a.has_embedding()) {
      EXPECT_TRUE(std::equal(a.grad_input().begin(), a.grad_input().end(), b.grad_input().begin()));
    }
    for (size_t t = 0; t < a.tensors().size(); ++t) {
      const std::span<double> x = a.grad(static_cast<int>(t));
      const std::span<double> y = b.grad(static_cast<int>(t));
      ASSERT_TRUE(std::equal(x.begin(), x.end(), y.begin())) << a.tensors()[t].name;
    }
  }
  EXPECT_EQ(Gpt<double>::Create(spec, device.get(), {.split_backward = true, .recompute = true})
                .status()
                .code(),
            ErrorCode::kInvalidArgument);
}

TEST(GptModelTest, StagesRejectBadRangesSlotsAndInputs) {
  auto device = Cpu();
  const ModelSpec spec = Small(true);
  EXPECT_EQ(Gpt<float>::Create(spec, device.get(), {.first_layer = 2}).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(
      Gpt<float>::Create(spec, device.get(), {.first_layer = 1, .end_layer = 3}).status().code(),
      ErrorCode::kInvalidArgument);
  EXPECT_EQ(Gpt<float>::Create(spec, device.get(), {.slots = 0}).status().code(),
            ErrorCode::kInvalidArgument);
  auto last_stage = Gpt<float>::Create(spec, device.get(), {.first_layer = 1, .slots = 2});
  ASSERT_TRUE(last_stage.ok()) << last_stage.status();
  const std::vector<int32_t> tokens = Tokens((*last_stage)->tokens(), spec.vocab, 1);
  // The last stage takes targets but no tokens; slot 2 does not exist.
  EXPECT_THAT((*last_stage)->Forward(0, tokens, tokens, 1).status().message(),
              ::testing::HasSubstr("expected 0 and 10"));
  EXPECT_THAT((*last_stage)->Forward(2, {}, tokens, 1).status().message(),
              ::testing::HasSubstr("slot 2 outside [0, 2)"));
  EXPECT_TRUE((*last_stage)->Forward(1, {}, tokens, 1).ok());
  EXPECT_EQ((*last_stage)->Backward(0, false, [](int) { return OkStatus(); }).code(),
            ErrorCode::kFailedPrecondition);  // slot 0 had no forward
  EXPECT_TRUE((*last_stage)->Backward(1, false, [](int) { return OkStatus(); }).ok());
  EXPECT_TRUE((*last_stage)->stage_output(0).empty());  // the last stage has no output
  EXPECT_EQ((*last_stage)->stage_input(0).size(), static_cast<size_t>(10 * spec.hidden));
}

TEST(GptModelTest, AccumulateAddsTheSecondBatchsGradient) {
  auto device = Cpu();
  auto model = Gpt<double>::Create(Small(true), device.get(), {});
  ASSERT_TRUE(model.ok());
  Gpt<double>& m = **model;
  m.InitParameters(1);
  const auto in1 = Tokens(m.tokens(), 11, 5), tg1 = Tokens(m.tokens(), 11, 6);
  const auto in2 = Tokens(m.tokens(), 11, 7), tg2 = Tokens(m.tokens(), 11, 8);
  auto none = [](int) { return OkStatus(); };
  auto grads = [&] { return std::vector<double>(m.grad(0).begin(), m.grad(0).end()); };
  ASSERT_TRUE(m.Forward(in1, tg1, 1.0).ok());
  ASSERT_TRUE(m.Backward(false, none).ok());
  const auto g1 = grads();
  ASSERT_TRUE(m.Forward(in2, tg2, 1.0).ok());
  ASSERT_TRUE(m.Backward(false, none).ok());
  const auto g2 = grads();
  ASSERT_TRUE(m.Forward(in1, tg1, 1.0).ok());
  ASSERT_TRUE(m.Backward(true, none).ok());  // g2 + g1
  const auto sum = grads();
  for (size_t i = 0; i < sum.size(); ++i) EXPECT_NEAR(sum[i], g1[i] + g2[i], 1e-12) << i;
}

TEST(GptModelTest, BackwardNeedsAForwardWithGradient) {
  auto device = Cpu();
  auto model = Gpt<float>::Create(Small(true), device.get(), {});
  ASSERT_TRUE(model.ok());
  auto none = [](int) { return OkStatus(); };
  EXPECT_EQ((*model)->Backward(false, none).code(), ErrorCode::kFailedPrecondition);
  const auto in = Tokens((*model)->tokens(), 11, 1);
  ASSERT_TRUE((*model)->Forward(in, in, 0).ok());
  EXPECT_EQ((*model)->Backward(false, none).code(), ErrorCode::kFailedPrecondition);
}

TEST(GptModelTest, RejectsTokensOutsideTheVocabAndWrongSizes) {
  auto device = Cpu();
  auto model = Gpt<float>::Create(Small(true), device.get(), {});
  ASSERT_TRUE(model.ok());
  std::vector<int32_t> in = Tokens((*model)->tokens(), 11, 1);
  std::vector<int32_t> tg = in;
  tg[3] = 11;
  Result<double> r = (*model)->Forward(in, tg, 0);
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("outside the vocab of 11"));
  in.pop_back();
  EXPECT_EQ((*model)->Forward(in, in, 0).status().code(), ErrorCode::kInvalidArgument);
}

TEST(GptModelTest, FloatAgreesWithDouble) {
  auto device = Cpu();
  ModelSpec spec = Small(true);
  auto f = Gpt<float>::Create(spec, device.get(), {});
  auto d = Gpt<double>::Create(spec, device.get(), {});
  ASSERT_TRUE(f.ok() && d.ok());
  (*f)->InitParameters(11);
  (*d)->InitParameters(11);
  for (size_t i = 0; i < (*f)->params().size(); ++i) {
    ASSERT_EQ((*f)->params()[i], static_cast<float>((*d)->params()[i]));
  }
  const auto in = Tokens((*f)->tokens(), 11, 1), tg = Tokens((*f)->tokens(), 11, 2);
  const double lf = *(*f)->Forward(in, tg, 1.0);
  const double ld = *(*d)->Forward(in, tg, 1.0);
  EXPECT_NEAR(lf, ld, 1e-5 * ld);
  // A fresh model predicts about uniformly: loss near log(vocab).
  EXPECT_NEAR(ld, std::log(11.0), 0.1);
}

TEST(GptModelTest, InitialisationIsDeterministicAndScaled) {
  auto device = Cpu();
  ModelSpec spec = Small(true);
  spec.hidden = 64;
  spec.ffn_hidden = 256;
  auto a = Gpt<float>::Create(spec, device.get(), {});
  auto b = Gpt<float>::Create(spec, device.get(), {});
  ASSERT_TRUE(a.ok() && b.ok());
  (*a)->InitParameters(5);
  (*b)->InitParameters(5);
  EXPECT_TRUE(std::equal((*a)->params().begin(), (*a)->params().end(), (*b)->params().begin()));
  auto stddev = [](std::span<const float> x) {
    double s = 0;
    for (float v : x) s += static_cast<double>(v) * v;
    return std::sqrt(s / static_cast<double>(x.size()));
  };
  const auto& tensors = (*a)->tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::span<const float> p = (*a)->param(static_cast<int>(i));
    if (tensors[i].name == "h.0.mlp.fc.weight") EXPECT_NEAR(stddev(p), 0.02, 0.002);
    if (tensors[i].name == "h.1.attn.proj.weight") EXPECT_NEAR(stddev(p), 0.01, 0.001);
    if (tensors[i].name == "h.0.ln1.weight") EXPECT_EQ(p[0], 1.0f);
    if (tensors[i].name == "h.0.attn.qkv.bias") EXPECT_EQ(p[0], 0.0f);
  }
}

// A few hundred AdamW steps on one repeated batch drive the loss far below log(vocab).
TEST(GptModelTest, TrainingMemorisesABatch) {
  auto device = Cpu();
  ModelSpec spec = Small(true);
  spec.hidden = 16;
  spec.ffn_hidden = 64;
  spec.training.lr = 1e-2f;
  auto model = Gpt<float>::Create(spec, device.get(), {});
  ASSERT_TRUE(model.ok());
  Gpt<float>& m = **model;
  m.InitParameters(spec.training.seed);
  std::vector<OptimizerSlot<float>> slots;
  for (size_t i = 0; i < m.tensors().size(); ++i) {
    slots.push_back({m.param(static_cast<int>(i)), m.grad(static_cast<int>(i)),
                     m.tensors()[i].shape.size() == 2});
  }
  auto opt = AdamW<float>::Create(spec.training, slots, device.get());
  ASSERT_TRUE(opt.ok());
  const auto in = Tokens(m.tokens(), 11, 1), tg = Tokens(m.tokens(), 11, 2);
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    Result<double> loss = m.Forward(in, tg, 1.0 / m.tokens());
    ASSERT_TRUE(loss.ok());
    if (step == 0) first = *loss;
    last = *loss;
    ASSERT_TRUE(m.Backward(false, [](int) { return OkStatus(); }).ok());
    (*opt)->Step(LearningRate(spec.training, step, 150),
                 ClipScale(spec.training, (*opt)->GradNorm()));
  }
  EXPECT_GT(first, 2.0);
  EXPECT_LT(last, 0.5);
}

}  // namespace
}  // namespace kc::parallel
