// Recall, not reasoning: a question that asks again what an earlier lesson asked and answered, with
// the same numbers or the same experiment, tests memory. Each lesson's own check (app/spoilers.h)
// only knows that lesson; this one compares the course's lessons with each other, without a run,
// and the course test (tests/test_spoilers.cpp) runs it over lessons/*.md.
#pragma once
#include <string>
#include <vector>

#include "app/lesson.h"

namespace dtlab::app {

// A question that repeats an earlier lesson's. `later` and `earlier` are "path:line", the lines of
// their ```question blocks; `why` one clause: "the same answer (3.5 GB) to a prompt with the same
// numbers (14)".
struct Repeat {
  std::string later, earlier, why;
};

// The questions of `course` (lessons in course order) that repeat a question of an earlier lesson.
// A question's value is known without a run when its answer is a formula (value_without_run) or,
// failing that, when its `expect:` is plain arithmetic. A later question repeats an earlier one when
// - both values are known, in the same unit, the later question takes the earlier value as right,
//   and either the answers read the same figure (the same `answer:` text) or the prompts share a
//   number other than 0, 1 and 2 (which every prompt has): "14 GB", "a 7B model";
// - or both are asked on the same experiment, and their answers read the same live figure (one
//   that a view draws; a count and a share of it are the same fact): the same faults (kind and rank)
//   on the same side of the watchdog's timeout (a delay longer than it ends the run, a shorter one
//   only stalls it; a skip always ends it), and the loop calling sampler.set_epoch or not
//   (`set_epoch off`). Choice questions are compared this way only, as their values are places in
//   their own lists.
// A lesson that draws its numbers (`draw:`) is a repeat only under every draw: the caller parses it
// with several seeds and keeps what they all find.
std::vector<Repeat> find_repeats(const std::vector<Lesson>& course);

}  // namespace dtlab::app
