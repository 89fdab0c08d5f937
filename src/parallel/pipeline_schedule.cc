#include "parallel/pipeline_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

namespace kc::parallel {
namespace {

// 1F1B's order for one stage: `warmup` forwards, then forward/backward pairs, then the
// remaining backwards. `forward(k)` and `backward(k)` give the k-th of each kind.
template <typename ForwardFn, typename BackwardFn>
std::vector<PipeOp> OneForwardOneBackward(int total, int warmup, ForwardFn forward,
                                          BackwardFn backward) {
  std::vector<PipeOp> ops;
  warmup = std::min(warmup, total);
  for (int k = 0; k < warmup; ++k) ops.push_back(forward(k));
  for (int i = 0; i < total - warmup; ++i) {
    ops.push_back(forward(warmup + i));
    ops.push_back(backward(i));
  }
  for (int k = total - warmup; k < total; ++k) ops.push_back(backward(k));
  return ops;
}

}  // namespace

char PipeOpLetter(PipeOpKind kind) {
  switch (kind) {
    case PipeOpKind::kForward:
      return 'F';
    case PipeOpKind::kBackward:
      return 'B';
    case PipeOpKind::kBackwardInput:
      return 'b';
    case PipeOpKind::kBackwardWeight:
      return 'W';
  }
  return '?';
}

Result<std::vector<std::vector<PipeOp>>> BuildPipelineSchedule(Schedule schedule, int p, int m,
                                                               int v) {
  if (p < 1 || m < 1 || v < 1) {
    return InvalidArgumentError(
        fmt::format("pipeline schedule: p={} m={} v={}: each must be at least 1", p, m, v));
  }
  if (schedule != Schedule::kInterleaved && v != 1) {
    return InvalidArgumentError(fmt::format(
        "pipeline schedule: v={} needs the interleaved schedule ({} runs one chunk per stage)", v,
        ScheduleName(schedule)));
  }
  if (schedule == Schedule::kInterleaved && (p < 2 || m % p != 0)) {
    return InvalidArgumentError(fmt::format(
        "pipeline schedule: interleaved needs p >= 2 and m a multiple of p; p={} m={}", p, m));
  }
  std::vector<std::vector<PipeOp>> stages(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) {
    std::vector<PipeOp>& ops = stages[static_cast<size_t>(s)];
    switch (schedule) {
      case Schedule::kGpipe:
        for (int k = 0; k < m; ++k) ops.push_back({PipeOpKind::kForward, k, 0});
        for (int k = 0; k < m; ++k) ops.push_back({PipeOpKind::kBackward, k, 0});
        break;
      case Schedule::k1F1B:
        ops = OneForwardOneBackward(
            m, p - s - 1,
            [](int k) {
              return PipeOp{PipeOpKind::kForward, k, 0};
            },
            [](int k) {
              return PipeOp{PipeOpKind::kBackward, k, 0};
            });
        break;
      case Schedule::kZeroBubbleH1: {
        // Stage s puts off its weight passes by s backwards: the later a stage, the longer
        // it would idle at the end while the last input gradients travel back, and the W
        // passes fill that time (stage 0, the one the flush waits for, puts off none).
        int next_weight = 0;
        for (const PipeOp& op : OneForwardOneBackward(
                 m, p - s - 1,
                 [](int k) {
                   return PipeOp{PipeOpKind::kForward, k, 0};
                 },
                 [](int k) {
                   return PipeOp{PipeOpKind::kBackwardInput, k, 0};
                 })) {
          ops.push_back(op);
          if (op.kind == PipeOpKind::kBackwardInput && op.micro_batch - s >= 0) {
            ops.push_back({PipeOpKind::kBackwardWeight, next_weight++, 0});
          }
        }
        while (next_weight < m) ops.push_back({PipeOpKind::kBackwardWeight, next_weight++, 0});
        break;
      }
      case Schedule::kInterleaved: {
        // Megatron-LM: the k-th forward of a stage runs chunk (k mod pv) / p on micro-batch
        // (k / pv) p + k mod p; backwards walk the chunks the other way round.
        const int total = m * v;
        const int warmup = m == p ? total : (p - s - 1) * 2 + (v - 1) * p;
        auto micro_batch = [p, v](int k) { return (k / (p * v)) * p + k % p; };
        ops = OneForwardOneBackward(
            total, warmup,
            [&](int k) {
              return PipeOp{PipeOpKind::kForward, micro_batch(k), (k % (p * v)) / p};
            },
            [&](int k) {
              return PipeOp{PipeOpKind::kBackward, micro_batch(k), v - 1 - (k % (p * v)) / p};
            });
        break;
      }
    }
  }
  return stages;
}

Result<PipelineSimulation> SimulatePipeline(const std::vector<std::vector<PipeOp>>& schedule, int v,
                                            const PipeCosts& costs) {
  const int p = static_cast<int>(schedule.size());
  if (p < 1 || v < 1) {
    return InvalidArgumentError("pipeline simulation: needs at least one stage and v >= 1");
  }
  const int last = p * v - 1;  // the last virtual stage
  // End times by (virtual stage, micro-batch).
  std::map<std::pair<int, int>, double> forward_end, input_grad_end;
  std::map<std::tuple<int, int, int>, int> seen;  // (kind class, vs, mb) -> count
  for (int s = 0; s < p; ++s) {
    for (const PipeOp& op : schedule[static_cast<size_t>(s)]) {
      if (op.chunk < 0 || op.chunk >= v || op.micro_batch < 0) {
        return InvalidArgumentError(
            fmt::format("pipeline simulation: stage {}: {}{} chunk {}: "
                        "chunk or micro-batch out of range",
                        s, PipeOpLetter(op.kind), op.micro_batch, op.chunk));
      }
      const int vs = op.chunk * p + s;
      if (++seen[{static_cast<int>(op.kind), vs, op.micro_batch}] > 1) {
        return InvalidArgumentError(
            fmt::format("pipeline simulation: stage {}: {}{} chunk {} "
                        "appears twice",
                        s, PipeOpLetter(op.kind), op.micro_batch, op.chunk));
      }
    }
  }
  // Every forward has a backward: B, or b and W; never both kinds.
  for (const auto& [key, count] : seen) {
    const auto [kind, vs, mb] = key;
    if (kind != static_cast<int>(PipeOpKind::kForward)) continue;
    auto has = [&, vs = vs, mb = mb](PipeOpKind k) {
      return seen.contains({static_cast<int>(k), vs, mb});
    };
    const bool whole = has(PipeOpKind::kBackward);
    const bool split = has(PipeOpKind::kBackwardInput) && has(PipeOpKind::kBackwardWeight);
    if (whole == split ||
        (whole && (has(PipeOpKind::kBackwardInput) || has(PipeOpKind::kBackwardWeight)))) {
      return InvalidArgumentError(fmt::format(
          "pipeline simulation: stage {}: micro-batch {} chunk {} needs one B, or one b and one "
          "W, after its F",
          vs % p, mb, vs / p));
    }
  }

  PipelineSimulation sim;
  sim.stages.resize(static_cast<size_t>(p));
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> free_at(static_cast<size_t>(p), 0);
  std::vector<int> held(static_cast<size_t>(p), 0);
  const double scale = 1.0 / v;
  size_t remaining = 0;
  for (const auto& ops : schedule) remaining += ops.size();
  while (remaining > 0) {
    bool progress = false;
    for (int s = 0; s < p; ++s) {
      const std::vector<PipeOp>& ops = schedule[static_cast<size_t>(s)];
      size_t& i = next[static_cast<size_t>(s)];
      while (i < ops.size()) {
        const PipeOp& op = ops[i];
        const int vs = op.chunk * p + s;
        const std::pair<int, int> key{vs, op.micro_batch};
        double ready = 0;
        double cost = 0;
        bool ok = true;
        switch (op.kind) {
          case PipeOpKind::kForward:
            cost = costs.forward * scale;
            if (vs > 0) {
              auto it = forward_end.find({vs - 1, op.micro_batch});
              ok = it != forward_end.end();
              if (ok) ready = it->second + costs.send;
            }
            break;
          case PipeOpKind::kBackward:
          case PipeOpKind::kBackwardInput: {
            cost = (op.kind == PipeOpKind::kBackward ? costs.backward_input + costs.backward_weight
                                                     : costs.backward_input) *
                   scale;
            auto own = forward_end.find(key);
            ok = own != forward_end.end();
            if (ok) ready = own->second;
            if (ok && vs < last) {
              auto it = input_grad_end.find({vs + 1, op.micro_batch});
              ok = it != input_grad_end.end();
              if (ok) ready = std::max(ready, it->second + costs.send);
            }
            break;
          }
          case PipeOpKind::kBackwardWeight: {
            cost = costs.backward_weight * scale;
            auto it = input_grad_end.find(key);
            ok = it != input_grad_end.end();
            if (ok) ready = it->second;
            break;
          }
        }
        if (!ok) break;
        const double start = std::max(ready, free_at[static_cast<size_t>(s)]);
        const double end = start + cost;
        free_at[static_cast<size_t>(s)] = end;
        if (op.kind == PipeOpKind::kForward) {
          forward_end[key] = end;
        } else if (op.kind != PipeOpKind::kBackwardWeight) {
          input_grad_end[key] = end;
        }
        StageTimeline& t = sim.stages[static_cast<size_t>(s)];
        t.busy += cost;
        int& h = held[static_cast<size_t>(s)];
        if (op.kind == PipeOpKind::kForward) {
          t.peak_activations = std::max(t.peak_activations, ++h);
        } else if (op.kind != PipeOpKind::kBackwardInput) {
          --h;
        }
        sim.spans.push_back({s, op, start, end});
        sim.makespan = std::max(sim.makespan, end);
        ++i;
        --remaining;
        progress = true;
      }
    }
    if (!progress) {
      std::string stuck;
      for (int s = 0; s < p; ++s) {
        const size_t i = next[static_cast<size_t>(s)];
        if (i < schedule[static_cast<size_t>(s)].size()) {
          const PipeOp& op = schedule[static_cast<size_t>(s)][i];
          stuck += fmt::format("{}stage {} waits forever at pass {} ({}{} chunk {})",
                               stuck.empty() ? "" : "; ", s, i, PipeOpLetter(op.kind),
                               op.micro_batch, op.chunk);
        }
      }
      return InvalidArgumentError("pipeline simulation: deadlock: " + stuck +
                                  ": each waits for an input the others never produce");
    }
  }
  double idle = 0;
  for (StageTimeline& t : sim.stages) {
    t.idle = sim.makespan - t.busy;
    t.bubble_fraction = sim.makespan > 0 ? t.idle / sim.makespan : 0;
    idle += t.idle;
  }
  sim.bubble_fraction = sim.makespan > 0 ? idle / (p * sim.makespan) : 0;
  return sim;
}

double IdealBubbleFraction(int p, int m) {
  return static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
}

Result<std::vector<int>> PartitionByCost(std::span<const double> costs, int parts) {
  const int n = static_cast<int>(costs.size());
  if (parts < 1 || parts > n) {
    return InvalidArgumentError(
        fmt::format("partition: {} parts of {} units: need 1 <= parts <= units", parts, n));
  }
  for (double c : costs) {
    if (c < 0) return InvalidArgumentError("partition: a cost is negative");
  }
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0);
  for (int i = 0; i < n; ++i)
    prefix[static_cast<size_t>(i) + 1] =
        prefix[static_cast<size_t>(i)] + costs[static_cast<size_t>(i)];
  auto sum = [&](int a, int b) {
    return prefix[static_cast<size_t>(b)] - prefix[static_cast<size_t>(a)];
  };
  // best[k][i]: for the first i units as k parts, the smallest largest part, then the
  // smallest sum of squares (the most even split among the equally good); cut[k][i]: where
  // the k-th part starts then. Ties go to the later cut, so earlier parts take the extra
  // units.
  using Score = std::pair<double, double>;
  const Score none{std::numeric_limits<double>::infinity(), 0};
  std::vector<std::vector<Score>> best(static_cast<size_t>(parts) + 1,
                                       std::vector<Score>(static_cast<size_t>(n) + 1, none));
  std::vector<std::vector<int>> cut(static_cast<size_t>(parts) + 1,
                                    std::vector<int>(static_cast<size_t>(n) + 1, 0));
  best[0][0] = {0, 0};
  for (int k = 1; k <= parts; ++k) {
    for (int i = k; i <= n - (parts - k); ++i) {
      Score& b = best[static_cast<size_t>(k)][static_cast<size_t>(i)];
      for (int j = k - 1; j < i; ++j) {
        const Score& prev = best[static_cast<size_t>(k) - 1][static_cast<size_t>(j)];
        if (prev == none) continue;
        const double part = sum(j, i);
        const Score score{std::max(prev.first, part), prev.second + part * part};
        if (score <= b) {
          b = score;
          cut[static_cast<size_t>(k)][static_cast<size_t>(i)] = j;
        }
      }
    }
  }
  std::vector<int> bounds(static_cast<size_t>(parts) + 1, 0);
  bounds[static_cast<size_t>(parts)] = n;
  for (int k = parts, i = n; k > 0; --k) {
    i = cut[static_cast<size_t>(k)][static_cast<size_t>(i)];
    bounds[static_cast<size_t>(k) - 1] = i;
  }
  return bounds;
}

std::vector<double> LayerCosts(const ModelSpec& spec) {
  const double c = static_cast<double>(spec.hidden);
  const double t = static_cast<double>(spec.seq_len);
  const double l = static_cast<double>(spec.layers);
  // TrainingFlopsPerToken's terms (docs/user-guide/models.md): 6 per parameter of a block,
  // 6 T C for its attention scores, and 6 V C for the logits on the last stage.
  const double block_params = static_cast<double>(NonEmbeddingParameterCount(spec)) / l;
  std::vector<double> costs(static_cast<size_t>(spec.layers), 6 * block_params + 6 * t * c);
  if (!costs.empty()) costs.back() += 6 * static_cast<double>(spec.vocab) * c;
  return costs;
}

Result<std::vector<int>> BalanceStages(const ModelSpec& spec, int stages) {
  if (stages < 1 || stages > spec.layers) {
    return InvalidArgumentError(
        fmt::format("pipeline: {} stages for {} layers: every stage needs a layer (p from 1 to {})",
                    stages, spec.layers, spec.layers));
  }
  const std::vector<double> costs = LayerCosts(spec);
  return PartitionByCost(costs, stages);
}

std::string ScheduleToString(const std::vector<std::vector<PipeOp>>& schedule, int v) {
  std::string out;
  for (size_t s = 0; s < schedule.size(); ++s) {
    out += fmt::format("s{}:", s);
    for (const PipeOp& op : schedule[s]) {
      out += fmt::format(" {}{}", PipeOpLetter(op.kind), op.micro_batch);
      if (v > 1) out += fmt::format(".{}", op.chunk);
    }
    out += "\n";
  }
  return out;
}

}  // namespace kc::parallel
