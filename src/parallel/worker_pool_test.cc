#include "parallel/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace kc::parallel {
namespace {

TEST(WorkerPoolTest, RunsEveryWorkerOnceOnItsOwnThreadPerRun) {
  WorkerPool pool(3);
  EXPECT_EQ(pool.threads(), 3);
  for (int run = 0; run < 50; ++run) {
    std::vector<int> calls(3, 0);
    std::vector<std::thread::id> ids(3);
    pool.Run([&](int k) {
      ++calls[k];
      ids[k] = std::this_thread::get_id();
    });
    EXPECT_EQ(calls, std::vector<int>({1, 1, 1}));
    EXPECT_EQ(ids[0], std::this_thread::get_id());  // worker 0 is the caller
    EXPECT_NE(ids[1], ids[0]);
    EXPECT_NE(ids[2], ids[1]);
  }
}

TEST(WorkerPoolTest, RunReturnsOnlyAfterEveryWorkerFinished) {
  WorkerPool pool(2);
  std::atomic<int> done{0};
  for (int run = 0; run < 100; ++run) {
    pool.Run([&](int) { done.fetch_add(1); });
    EXPECT_EQ(done.load(), 2 * (run + 1));
  }
}

TEST(WorkerPoolTest, OneThreadRunsOnTheCaller) {
  WorkerPool pool(1);
  std::thread::id id;
  pool.Run([&](int k) {
    EXPECT_EQ(k, 0);
    id = std::this_thread::get_id();
  });
  EXPECT_EQ(id, std::this_thread::get_id());
}

// Each Sync runs its serial step once, after every worker wrote its part and before any reads
// the result.
TEST(WorkerPoolTest, SyncRunsOneStepBetweenTheWorkersHalves) {
  for (int threads : {1, 2, 3}) {
    WorkerPool pool(threads);
    std::vector<int> parts(static_cast<size_t>(threads), 0);
    int sum = 0, serial_calls = 0;
    std::vector<int> seen(static_cast<size_t>(threads), -1);
    for (int round = 1; round <= 20; ++round) {
      pool.Run([&](int k) {
        parts[static_cast<size_t>(k)] = round * (k + 1);
        Status s = pool.Sync([&]() -> Status {
          ++serial_calls;
          sum = 0;
          for (int x : parts) sum += x;
          return OkStatus();
        });
        EXPECT_TRUE(s.ok()) << s;
        seen[static_cast<size_t>(k)] = sum;
      });
      const int want = round * threads * (threads + 1) / 2;
      for (int x : seen) EXPECT_EQ(x, want) << threads << " threads, round " << round;
    }
    EXPECT_EQ(serial_calls, 20) << threads << " threads";
  }
}

TEST(WorkerPoolTest, SyncPassesTheSerialStepsErrorToEveryWorker) {
  WorkerPool pool(3);
  std::vector<Status> got(3);
  pool.Run([&](int k) {
    got[static_cast<size_t>(k)] = pool.Sync([] { return UnavailableError("peer gone"); });
  });
  for (const Status& s : got) EXPECT_EQ(s.code(), ErrorCode::kUnavailable) << s;
}

// A worker that gives up before a Sync (its pass failed) holds nobody up: the others' Sync
// returns kAborted without running the serial step, and the Run ends.
TEST(WorkerPoolTest, AWorkerThatReturnsEarlyAbortsTheSyncInsteadOfHangingIt) {
  for (int quitter : {0, 1, 2}) {
    WorkerPool pool(3);
    std::atomic<int> serial_calls{0};
    std::vector<Status> got(3);
    pool.Run([&](int k) {
      if (k == quitter) return;
      got[static_cast<size_t>(k)] = pool.Sync([&] {
        serial_calls.fetch_add(1);
        return OkStatus();
      });
      // A second meeting: the quitter still counts as arrived.
      if (got[static_cast<size_t>(k)].ok()) return;
      got[static_cast<size_t>(k)] = pool.Sync([&] {
        serial_calls.fetch_add(1);
        return OkStatus();
      });
    });
    EXPECT_EQ(serial_calls.load(), 0) << "quitter " << quitter;
    for (int k = 0; k < 3; ++k) {
      if (k == quitter) continue;
      EXPECT_EQ(got[static_cast<size_t>(k)].code(), ErrorCode::kAborted) << "quitter " << quitter;
    }
    // The pool is still good for the next pass.
    int calls = 0;
    pool.Run([&](int) { EXPECT_TRUE(pool.Sync([&] { return ++calls, OkStatus(); }).ok()); });
    EXPECT_EQ(calls, 1);
  }
}

}  // namespace
}  // namespace kc::parallel
