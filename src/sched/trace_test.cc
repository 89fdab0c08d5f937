#include "sched/trace.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kc::sched {
namespace {

using ::testing::HasSubstr;

constexpr char kHeader[] = "submit_s,job,team,user,class,min_devices,max_devices,duration_s";

TEST(TraceTest, ReadsRowsSortedBySubmitWithOptionalColumns) {
  Result<std::vector<TraceJob>> t = LoadTraceString(
      "# a comment\n"
      "submit_s,job,team,user,class,min_devices,max_devices,duration_s,tp,note,checkpoint_s\n"
      "20,b,vision,ann,high,2,4,600,2,ignored,15\n"
      "\n"
      "10,a,nlp,bo,preemptible,1,1,60.5,1,,\n",
      "t.csv");
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].job, "a");
  EXPECT_EQ((*t)[0].duration_s, 60.5);
  EXPECT_EQ((*t)[0].checkpoint_s, -1);
  EXPECT_EQ((*t)[1].job, "b");
  EXPECT_EQ((*t)[1].team, "vision");
  EXPECT_EQ((*t)[1].job_class, "high");
  EXPECT_EQ((*t)[1].tp, 2);
  EXPECT_EQ((*t)[1].checkpoint_s, 15);
  EXPECT_EQ((*t)[1].max_devices, 4);
}

TEST(TraceTest, WritingAndReadingGiveTheSameJobs) {
  std::vector<TraceJob> jobs = {{.submit_s = 0.125,
                                 .job = "x",
                                 .team = "t",
                                 .user = "u",
                                 .job_class = "normal",
                                 .min_devices = 2,
                                 .max_devices = 8,
                                 .duration_s = 3600.5,
                                 .kind = "H100",
                                 .pool = "p",
                                 .tp = 2,
                                 .checkpoint_s = 30,
                                 .faults_per_hour = 1.5},
                                {.submit_s = 7,
                                 .job = "y",
                                 .team = "t",
                                 .user = "v",
                                 .job_class = "high",
                                 .min_devices = 1,
                                 .max_devices = 1,
                                 .duration_s = 10}};
  Result<std::vector<TraceJob>> back = LoadTraceString(TraceToCsv(jobs), "round.csv");
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].kind, "H100");
  EXPECT_EQ((*back)[0].pool, "p");
  EXPECT_EQ((*back)[0].faults_per_hour, 1.5);
  EXPECT_EQ((*back)[0].submit_s, 0.125);
  EXPECT_EQ((*back)[1].checkpoint_s, -1);
  EXPECT_EQ((*back)[1].tp, 1);
}

TEST(TraceTest, ErrorsNameTheFileLineAndColumn) {
  auto error = [](std::string body) {
    return LoadTraceString(std::string(kHeader) + "\n" + body, "bad.csv").status().message();
  };
  EXPECT_THAT(error("0,a,t,u,normal,4,2,10\n"),
              HasSubstr("bad.csv:2: min_devices: 4 is above max_devices 2"));
  EXPECT_THAT(error("0,a,t,u,urgent,1,1,10\n"), HasSubstr("bad.csv:2: class: expected high"));
  EXPECT_THAT(error("0,a,t,u,normal,1,1,ten\n"),
              HasSubstr("bad.csv:2: duration_s: expected a number, got \"ten\""));
  EXPECT_THAT(error("0,a,t,u,normal,1,1\n"), HasSubstr("bad.csv:2: row: expected 8 fields"));
  EXPECT_THAT(error("0,a,t,u,normal,1,1,10\n1,a,t,u,normal,1,1,10\n"),
              HasSubstr("bad.csv:3: job: \"a\" is used by an earlier row"));
  EXPECT_THAT(error("-1,a,t,u,normal,1,1,10\n"), HasSubstr("submit_s: must not be negative"));
  EXPECT_THAT(error("0,a,t,u,normal,0,1,10\n"), HasSubstr("min_devices: must be at least 1"));
  EXPECT_THAT(error("0,a,t,u,normal,1,1,0\n"), HasSubstr("duration_s: must be positive"));
  EXPECT_THAT(error("0,a,t,u,normal,1.5,2,10\n"), HasSubstr("expected a whole number"));
  EXPECT_THAT(LoadTraceString("job,team\n", "h.csv").status().message(),
              HasSubstr("h.csv:1: submit_s: missing column"));
  EXPECT_THAT(LoadTraceString("", "empty.csv").status().message(), HasSubstr("no header line"));
  EXPECT_EQ(LoadTrace("/nonexistent/trace.csv").status().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace kc::sched
