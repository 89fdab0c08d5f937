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

}  // namespace
}  // namespace kc::parallel
