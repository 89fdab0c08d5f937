#include "parallel/tensor_parallel.h"

#include <algorithm>
#include <string>

#include "base/check.h"

namespace kc::parallel {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

int64_t Product(std::span<const int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// A split along dim 0 as blocks of rows: `parts` blocks of `block` rows each, rank's `rows`
// of every block starting at rank * rows (those at or past the block's end are padding).
struct RowLayout {
  int64_t parts = 1;
  int64_t block = 0;
  int64_t rows = 0;
  int64_t inner = 1;  // elements per row
};

RowLayout RowsOf(std::span<const int64_t> shape, TpSplit split, int t) {
  RowLayout l;
  l.parts = split == TpSplit::kQkvRows ? 3 : 1;
  l.block = shape[0] / l.parts;
  l.rows = split == TpSplit::kVocab ? VocabShard(shape[0], t) : l.block / t;
  l.inner = Product(shape.subspan(1));
  return l;
}

// Calls fn(local element offset, whole element offset or -1 for padding, count) for every run
// of rank's shard.
template <typename Fn>
void ForEachRun(std::span<const int64_t> shape, TpSplit split, int rank, int t, Fn&& fn) {
  if (split == TpSplit::kReplicated) {
    fn(int64_t{0}, int64_t{0}, Product(shape));
    return;
  }
  if (split == TpSplit::kColumns) {
    const int64_t rows = shape[0], cols = shape[1], s = cols / t;
    for (int64_t r = 0; r < rows; ++r) fn(r * s, r * cols + rank * s, s);
    return;
  }
  const RowLayout l = RowsOf(shape, split, t);
  for (int64_t p = 0; p < l.parts; ++p) {
    for (int64_t i = 0; i < l.rows; ++i) {
      const int64_t row = rank * l.rows + i;
      fn((p * l.rows + i) * l.inner, row < l.block ? (p * l.block + row) * l.inner : -1, l.inner);
    }
  }
}

}  // namespace

std::string_view TpSplitName(TpSplit split) {
  switch (split) {
    case TpSplit::kReplicated:
      return "replicated";
    case TpSplit::kVocab:
      return "vocab";
    case TpSplit::kRows:
      return "rows";
    case TpSplit::kQkvRows:
      return "qkv rows";
    case TpSplit::kColumns:
      return "columns";
  }
  return "unknown";
}

TpSplit TensorParallelSplit(std::string_view name) {
  if (name == "wte" || name == "lm_head.weight") return TpSplit::kVocab;
  if (EndsWith(name, "attn.qkv.weight") || EndsWith(name, "attn.qkv.bias")) {
    return TpSplit::kQkvRows;
  }
  if (EndsWith(name, "mlp.fc.weight") || EndsWith(name, "mlp.fc.bias")) return TpSplit::kRows;
  if (EndsWith(name, "attn.proj.weight") || EndsWith(name, "mlp.proj.weight")) {
    return TpSplit::kColumns;
  }
  return TpSplit::kReplicated;
}

int64_t VocabShard(int64_t vocab, int t) { return (vocab + t - 1) / t; }

std::vector<int64_t> ShardShape(std::span<const int64_t> shape, TpSplit split, int t) {
  std::vector<int64_t> out(shape.begin(), shape.end());
  if (split == TpSplit::kReplicated) return out;
  if (split == TpSplit::kColumns) {
    out[1] /= t;
    return out;
  }
  const RowLayout l = RowsOf(shape, split, t);
  out[0] = l.parts * l.rows;
  return out;
}

template <typename Real>
void ExtractShard(std::span<const Real> whole, std::span<const int64_t> shape, TpSplit split,
                  int rank, int t, std::span<Real> shard) {
  KC_CHECK(static_cast<int64_t>(shard.size()) == Product(ShardShape(shape, split, t)));
  ForEachRun(shape, split, rank, t, [&](int64_t local, int64_t from, int64_t n) {
    Real* to = shard.data() + local;
    if (from < 0) {
      std::fill(to, to + n, Real{0});
    } else {
      std::copy_n(whole.data() + from, n, to);
    }
  });
}

template <typename Real>
void InsertShard(std::span<const Real> shard, std::span<const int64_t> shape, TpSplit split,
                 int rank, int t, std::span<Real> whole) {
  KC_CHECK(static_cast<int64_t>(whole.size()) == Product(shape));
  ForEachRun(shape, split, rank, t, [&](int64_t local, int64_t to, int64_t n) {
    if (to >= 0) std::copy_n(shard.data() + local, n, whole.data() + to);
  });
}

Status ValidateTensorParallel(const ModelSpec& spec, int t) {
  std::string works;
  for (int64_t d = 1; d <= spec.heads; ++d) {
    if (spec.heads % d == 0 && spec.ffn_hidden % d == 0) {
      works += (works.empty() ? "" : ", ") + std::to_string(d);
    }
  }
  auto fail = [&](const std::string& what) {
    return InvalidArgumentError("model " + spec.name + ": tensor parallel t=" + std::to_string(t) +
                                " " + what + " (t that work: " + works + ")");
  };
  if (t < 1) return fail("must be at least 1");
  if (spec.heads % t != 0) {
    return fail("does not divide the " + std::to_string(spec.heads) + " attention heads");
  }
  if (spec.ffn_hidden % t != 0) {
    return fail("does not divide ffn_hidden " + std::to_string(spec.ffn_hidden));
  }
  return OkStatus();
}

template void ExtractShard<float>(std::span<const float>, std::span<const int64_t>, TpSplit, int,
                                  int, std::span<float>);
template void ExtractShard<double>(std::span<const double>, std::span<const int64_t>, TpSplit, int,
                                   int, std::span<double>);
template void InsertShard<float>(std::span<const float>, std::span<const int64_t>, TpSplit, int,
                                 int, std::span<float>);
template void InsertShard<double>(std::span<const double>, std::span<const int64_t>, TpSplit, int,
                                  int, std::span<double>);

}  // namespace kc::parallel
