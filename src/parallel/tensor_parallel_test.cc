#include "parallel/tensor_parallel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "base/mutex.h"
#include "parallel/gpt_model.h"
#include "parallel/gpt_test_support.h"

namespace kc::parallel {
namespace {

using ::kc::parallel::testing::Cpu;
using ::kc::parallel::testing::Tokens;

using ::testing::HasSubstr;

TEST(TensorParallelTest, SplitsFollowMegatron) {
  EXPECT_EQ(TensorParallelSplit("wte"), TpSplit::kVocab);
  EXPECT_EQ(TensorParallelSplit("lm_head.weight"), TpSplit::kVocab);
  EXPECT_EQ(TensorParallelSplit("wpe"), TpSplit::kReplicated);
  EXPECT_EQ(TensorParallelSplit("h.3.attn.qkv.weight"), TpSplit::kQkvRows);
  EXPECT_EQ(TensorParallelSplit("h.3.attn.qkv.bias"), TpSplit::kQkvRows);
  EXPECT_EQ(TensorParallelSplit("h.3.attn.proj.weight"), TpSplit::kColumns);
  EXPECT_EQ(TensorParallelSplit("h.3.attn.proj.bias"), TpSplit::kReplicated);
  EXPECT_EQ(TensorParallelSplit("h.0.mlp.fc.weight"), TpSplit::kRows);
  EXPECT_EQ(TensorParallelSplit("h.0.mlp.fc.bias"), TpSplit::kRows);
  EXPECT_EQ(TensorParallelSplit("h.0.mlp.proj.weight"), TpSplit::kColumns);
  EXPECT_EQ(TensorParallelSplit("h.0.mlp.proj.bias"), TpSplit::kReplicated);
  EXPECT_EQ(TensorParallelSplit("h.0.ln1.weight"), TpSplit::kReplicated);
  EXPECT_EQ(TensorParallelSplit("lnf.bias"), TpSplit::kReplicated);
}

TEST(TensorParallelTest, ShardShapes) {
  const std::vector<int64_t> vocab = {11, 4}, qkv = {12, 4}, cols = {4, 6}, bias = {12};
  EXPECT_EQ(ShardShape(vocab, TpSplit::kVocab, 2), (std::vector<int64_t>{6, 4}));  // padded
  EXPECT_EQ(ShardShape(vocab, TpSplit::kVocab, 3), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(ShardShape(qkv, TpSplit::kQkvRows, 2), (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(ShardShape(cols, TpSplit::kColumns, 3), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(ShardShape(bias, TpSplit::kRows, 4), (std::vector<int64_t>{3}));
  EXPECT_EQ(ShardShape(bias, TpSplit::kReplicated, 4), bias);
  EXPECT_EQ(VocabShard(50257, 8), 6283);
}

// Every split: the shards put back together give the tensor, each element lands in exactly one
// shard, and padding is zero.
TEST(TensorParallelTest, ShardsRebuildTheWholeTensor) {
  struct Case {
    TpSplit split;
    std::vector<int64_t> shape;
  };
  const Case cases[] = {{TpSplit::kVocab, {11, 3}}, {TpSplit::kRows, {6, 2}},
                        {TpSplit::kRows, {6}},      {TpSplit::kQkvRows, {18, 2}},
                        {TpSplit::kQkvRows, {18}},  {TpSplit::kColumns, {2, 6}},
                        {TpSplit::kReplicated, {5}}};
  for (const Case& c : cases) {
    for (int t : {1, 2, 3}) {
      int64_t n = 1;
      for (int64_t d : c.shape) n *= d;
      std::vector<double> whole(static_cast<size_t>(n));
      std::iota(whole.begin(), whole.end(), 1.0);
      std::vector<double> rebuilt(whole.size(), 0.0);
      int64_t held = 0;
      for (int r = 0; r < t; ++r) {
        int64_t m = 1;
        for (int64_t d : ShardShape(c.shape, c.split, t)) m *= d;
        std::vector<double> shard(static_cast<size_t>(m), -1.0);
        ExtractShard<double>(whole, c.shape, c.split, r, t, shard);
        for (double x : shard) held += x != 0 ? 1 : 0;  // padding is the only zero
        InsertShard<double>(shard, c.shape, c.split, r, t, rebuilt);
      }
      const std::string what = std::string(TpSplitName(c.split)) + " t=" + std::to_string(t);
      EXPECT_EQ(rebuilt, whole) << what;
      EXPECT_EQ(held, c.split == TpSplit::kReplicated ? n * t : n) << what;
    }
  }
  // Column blocks are the columns, rank by rank.
  std::vector<double> whole = {0, 1, 2, 3, 10, 11, 12, 13}, shard(4);
  ExtractShard<double>(whole, std::vector<int64_t>{2, 4}, TpSplit::kColumns, 1, 2, shard);
  EXPECT_EQ(shard, (std::vector<double>{2, 3, 12, 13}));
  // qkv: the rank's rows of each of q, k and v.
  whole = {0, 1, 2, 3, 4, 5};
  shard.assign(3, 0);
  ExtractShard<double>(whole, std::vector<int64_t>{6}, TpSplit::kQkvRows, 1, 2, shard);
  EXPECT_EQ(shard, (std::vector<double>{1, 3, 5}));
}

TEST(TensorParallelTest, ValidationNamesTheConstraintAndWhatWorks) {
  ModelSpec spec;
  spec.name = "m";
  spec.heads = 12;
  spec.ffn_hidden = 3072;
  EXPECT_TRUE(ValidateTensorParallel(spec, 4).ok());
  Status s = ValidateTensorParallel(spec, 5);
  EXPECT_THAT(s.message(), HasSubstr("t=5 does not divide the 12 attention heads"));
  EXPECT_THAT(s.message(), HasSubstr("t that work: 1, 2, 3, 4, 6, 12"));
  spec.ffn_hidden = 3070;
  s = ValidateTensorParallel(spec, 4);
  EXPECT_THAT(s.message(), HasSubstr("does not divide ffn_hidden 3070"));
  EXPECT_THAT(s.message(), HasSubstr("t that work: 1, 2)"));
}

// t ranks of one process as threads: each AllReduce waits for all, then the last to arrive
// reduces in rank order and writes the result into every member's buffer.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), pointers_(static_cast<size_t>(size)) {
    for (int r = 0; r < size; ++r) members_.emplace_back(this, r);
  }
  TensorParallelGroup* member(int rank) { return &members_[static_cast<size_t>(rank)]; }
  int calls() const { return calls_.load(); }

 private:
  class Member : public TensorParallelGroup {
   public:
    Member(ThreadGroup* group, int rank) : group_(group), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return group_->size_; }
    Status AllReduce(std::span<std::byte> data, size_t count, hal::DataType type,
                     comm::ReduceOp op) override {
      return group_->AllReduce(rank_, data, count, type, op);
    }

   private:
    ThreadGroup* group_;
    int rank_;
  };

  Status AllReduce(int rank, std::span<std::byte> data, size_t count, hal::DataType type,
                   comm::ReduceOp op) {
    MutexLock lock(&mu_);
    pointers_[static_cast<size_t>(rank)] = data;
    const uint64_t generation = generation_;
    if (++arrived_ < static_cast<int>(pointers_.size())) {
      while (generation_ == generation) cv_.Wait(&mu_);
      return OkStatus();
    }
    std::vector<std::byte> sum(pointers_[0].begin(), pointers_[0].end());
    for (size_t r = 1; r < pointers_.size(); ++r) {
      if (pointers_[r].size() != sum.size()) return InternalError("mismatched all-reduce sizes");
      comm::ReduceElements(type, op, sum.data(), sum.data(), pointers_[r].data(), count);
    }
    for (std::span<std::byte> p : pointers_) std::copy(sum.begin(), sum.end(), p.begin());
    arrived_ = 0;
    ++generation_;
    ++calls_;
    cv_.SignalAll();
    return OkStatus();
  }

  const int size_;
  Mutex mu_;
  CondVar cv_;
  std::vector<std::span<std::byte>> pointers_ KC_GUARDED_BY(mu_);
  int arrived_ KC_GUARDED_BY(mu_) = 0;
  uint64_t generation_ KC_GUARDED_BY(mu_) = 0;
  std::atomic<int> calls_{0};
  std::vector<Member> members_;
};

// Heads and MLP width divide by 2 and 3; the vocabulary by neither (padding).
ModelSpec Spec(bool tied) {
  ModelSpec s;
  s.name = "tp-check";
  s.layers = 2;
  s.hidden = 12;
  s.heads = 6;
  s.ffn_hidden = 18;
  s.vocab = 11;
  s.seq_len = 5;
  s.batch_per_rank = 2;
  s.tied_embeddings = tied;
  return s;
}

enum class Mode { kWhole, kSplit, kRecompute, kFirstStage, kLastStage };
std::string ModeName(Mode m) {
  switch (m) {
    case Mode::kWhole:
      return "whole";
    case Mode::kSplit:
      return "split";
    case Mode::kRecompute:
      return "recompute";
    case Mode::kFirstStage:
      return "first_stage";
    case Mode::kLastStage:
      return "last_stage";
  }
  return "";
}

// (t, tied, threads per rank, mode)
using Param = std::tuple<int, bool, int, Mode>;

class GptTensorParallelTest : public ::testing::TestWithParam<Param> {};

// t ranks, each holding its shards, give the single model's loss, gradients (each rank its
// part) and, for a stage, its boundary gradients, over two accumulated micro-batches.
TEST_P(GptTensorParallelTest, RanksTogetherComputeTheWholeModel) {
  const int t = std::get<0>(GetParam());
  const bool tied = std::get<1>(GetParam());
  const int threads = std::get<2>(GetParam());
  const Mode mode = std::get<3>(GetParam());
  const ModelSpec spec = Spec(tied);
  auto device = Cpu();
  GptOptions options{.threads = threads,
                     .split_backward = mode == Mode::kSplit,
                     .recompute = mode == Mode::kRecompute};
  if (mode == Mode::kFirstStage) options.end_layer = 1;
  if (mode == Mode::kLastStage) options.first_layer = 1;
  auto reference = Gpt<double>::Create(spec, device.get(), options);
  ASSERT_TRUE(reference.ok()) << reference.status();
  Gpt<double>& ref = **reference;
  auto whole = Gpt<double>::Create(spec, device.get(), {});  // for the whole tensors' values
  ASSERT_TRUE(whole.ok());
  Gpt<double>& w = **whole;
  w.InitParameters(7);
  std::mt19937 gen(3);
  std::normal_distribution<double> noise(0.0, 0.3);
  for (double& p : w.params()) p += noise(gen);
  for (size_t i = 0; i < ref.tensors().size(); ++i) {
    const std::span<double> src = w.param(ref.global_index(static_cast<int>(i)));
    std::copy(src.begin(), src.end(), ref.param(static_cast<int>(i)).begin());
  }

  const int64_t n = ref.tokens(), width = n * spec.hidden;
  const std::vector<int32_t> in[2] = {Tokens(n, spec.vocab, 1), Tokens(n, spec.vocab, 2)};
  const std::vector<int32_t> tg[2] = {Tokens(n, spec.vocab, 3), Tokens(n, spec.vocab, 4)};
  std::vector<double> boundary[2];  // stage_input or grad_output
  for (int mb = 0; mb < 2; ++mb) {
    boundary[mb].resize(static_cast<size_t>(width));
    for (double& x : boundary[mb]) x = noise(gen);
  }
  auto ignore = [](int) { return OkStatus(); };
  // One micro-batch through a model: forward, backward (whole or split), the loss, the
  // stage's output and input gradient.
  struct Out {
    double loss = 0;
    std::vector<double> output, grad_input;
  };
  auto run = [&](Gpt<double>& m, int mb, Out* out) -> Status {
    if (!m.has_embedding()) {
      std::copy(boundary[mb].begin(), boundary[mb].end(), m.stage_input(0).begin());
    }
    KC_ASSIGN_OR_RETURN(
        out->loss,
        m.Forward(0,
                  m.has_embedding() ? std::span<const int32_t>(in[mb]) : std::span<const int32_t>(),
                  m.has_head() ? std::span<const int32_t>(tg[mb]) : std::span<const int32_t>(),
                  1.0 / static_cast<double>(n)));
    std::span<const double> o = m.stage_output(0);
    out->output.assign(o.begin(), o.end());
    if (!m.has_head()) {
      std::copy(boundary[mb].begin(), boundary[mb].end(), m.grad_output().begin());
    }
    if (mode == Mode::kSplit) {
      KC_RETURN_IF_ERROR(m.BackwardInput(0));
      KC_RETURN_IF_ERROR(m.BackwardWeight(0, mb > 0, ignore));
    } else {
      KC_RETURN_IF_ERROR(m.Backward(0, mb > 0, ignore));
    }
    std::span<const double> g = m.grad_input();
    out->grad_input.assign(g.begin(), g.end());
    return OkStatus();
  };
  Out want[2];
  for (int mb = 0; mb < 2; ++mb) ASSERT_TRUE(run(ref, mb, &want[mb]).ok());

  ThreadGroup group(t);
  options.tensor_parallel = nullptr;
  std::vector<std::unique_ptr<Gpt<double>>> ranks(static_cast<size_t>(t));
  std::vector<Status> status(static_cast<size_t>(t));
  std::vector<std::array<Out, 2>> got(static_cast<size_t>(t));
  std::vector<std::thread> threads_of_ranks;
  for (int r = 0; r < t; ++r) {
    threads_of_ranks.emplace_back([&, r] {
      GptOptions o = options;
      o.tensor_parallel = group.member(r);
      auto m = Gpt<double>::Create(spec, device.get(), o);
      if (!m.ok()) {
        status[static_cast<size_t>(r)] = m.status();
        return;
      }
      ranks[static_cast<size_t>(r)] = std::move(*m);
      Gpt<double>& model = *ranks[static_cast<size_t>(r)];
      for (size_t i = 0; i < model.tensors().size(); ++i) {
        const int g = model.global_index(static_cast<int>(i));
        ExtractShard<double>(w.param(g), w.tensors()[static_cast<size_t>(g)].shape,
                             model.split(static_cast<int>(i)), r, t,
                             model.param(static_cast<int>(i)));
      }
      for (int mb = 0; mb < 2 && status[static_cast<size_t>(r)].ok(); ++mb) {
        status[static_cast<size_t>(r)] = run(model, mb, &got[static_cast<size_t>(r)][mb]);
      }
    });
  }
  for (std::thread& th : threads_of_ranks) th.join();
  for (const Status& s : status) ASSERT_TRUE(s.ok()) << s;
  EXPECT_GT(group.calls(), 0);

  for (int r = 0; r < t; ++r) {
    Gpt<double>& m = *ranks[static_cast<size_t>(r)];
    for (int mb = 0; mb < 2; ++mb) {
      const Out& a = got[static_cast<size_t>(r)][mb];
      EXPECT_NEAR(a.loss, want[mb].loss, 1e-12 * (1 + std::abs(want[mb].loss)));
      ASSERT_EQ(a.output.size(), want[mb].output.size());
      for (size_t j = 0; j < a.output.size(); ++j) {
        ASSERT_NEAR(a.output[j], want[mb].output[j], 1e-11) << "rank " << r << " output " << j;
      }
      ASSERT_EQ(a.grad_input.size(), want[mb].grad_input.size());
      for (size_t j = 0; j < a.grad_input.size(); ++j) {
        ASSERT_NEAR(a.grad_input[j], want[mb].grad_input[j], 1e-11)
            << "rank " << r << " grad_input " << j;
      }
    }
    for (size_t i = 0; i < m.tensors().size(); ++i) {
      const int g = m.global_index(static_cast<int>(i));
      const std::span<double> mine = m.grad(static_cast<int>(i));
      std::vector<double> expect(mine.size());
      ExtractShard<double>(ref.grad(static_cast<int>(i)), w.tensors()[static_cast<size_t>(g)].shape,
                           m.split(static_cast<int>(i)), r, t, expect);
      for (size_t j = 0; j < mine.size(); ++j) {
        ASSERT_NEAR(mine[j], expect[j], 1e-11 * (1 + std::abs(expect[j])))
            << "rank " << r << " " << m.tensors()[i].name << "[" << j << "]";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Plans, GptTensorParallelTest,
    ::testing::Combine(::testing::Values(2, 3), ::testing::Bool(), ::testing::Values(1, 2),
                       ::testing::Values(Mode::kWhole, Mode::kSplit, Mode::kRecompute,
                                         Mode::kFirstStage, Mode::kLastStage)),
    [](const ::testing::TestParamInfo<Param>& info) {
      return "t" + std::to_string(std::get<0>(info.param)) +
             (std::get<1>(info.param) ? "_tied" : "_untied") + "_threads" +
             std::to_string(std::get<2>(info.param)) + "_" + ModeName(std::get<3>(info.param));
    });

TEST(GptTensorParallelTest, ShardsStartAsTheWholeModelsValues) {
  const ModelSpec spec = Spec(false);
  auto device = Cpu();
  auto whole = Gpt<double>::Create(spec, device.get(), {});
  ASSERT_TRUE(whole.ok());
  (*whole)->InitParameters(9);
  ThreadGroup group(3);
  for (int r = 0; r < 3; ++r) {
    auto m = Gpt<double>::Create(spec, device.get(), {.tensor_parallel = group.member(r)});
    ASSERT_TRUE(m.ok()) << m.status();
    (*m)->InitParameters(9);
    int64_t elements = 0;
    for (size_t i = 0; i < (*m)->tensors().size(); ++i) {
      const int g = (*m)->global_index(static_cast<int>(i));
      const TensorSpec& ts = (*whole)->tensors()[static_cast<size_t>(g)];
      std::vector<double> expect((*m)->param(static_cast<int>(i)).size());
      ExtractShard<double>((*whole)->param(g), ts.shape, (*m)->split(static_cast<int>(i)), r, 3,
                           expect);
      const std::span<double> mine = (*m)->param(static_cast<int>(i));
      EXPECT_TRUE(std::equal(mine.begin(), mine.end(), expect.begin())) << ts.name;
      elements += static_cast<int64_t>(mine.size());
    }
    EXPECT_LT(elements, static_cast<int64_t>((*whole)->params().size()));
  }
}

TEST(GptTensorParallelTest, RejectsATThatDoesNotDivideTheHeads) {
  ModelSpec spec = Spec(false);
  auto device = Cpu();
  ThreadGroup group(4);
  auto m = Gpt<double>::Create(spec, device.get(), {.tensor_parallel = group.member(0)});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(m.status().message(), HasSubstr("t=4 does not divide the 6 attention heads"));
  EXPECT_THAT(m.status().message(), HasSubstr("t that work: 1, 2, 3, 6"));
}

}  // namespace
}  // namespace kc::parallel
