// spmd/pipeline/runner.cpp: run_pipeline (Note [Pipeline runner]).
#include <spmd/pipeline/runner.h>

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include <spmd/collectives/backend.h>
#include <spmd/collectives/functional.h>
#include <spmd/collectives/trace.h>
#include <spmd/core/error.h>
#include <spmd/ops/autograd.h>
#include <spmd/ops/ops.h>
#include <spmd/pipeline/timeline.h>
#include <spmd/tensor/meta.h>
#include <spmd/world/local_ops.h>

namespace spmd::pipeline {
namespace {

// What one (stage, microbatch) keeps between its actions.
struct InFlight {
  LocalTensor input;   // the leaf of a received activation (undefined on stage 0)
  LocalTensor output;  // the stage's output, or the scaled loss on the last stage
  LocalTensor grad;    // the output's gradient (received, or ones for the loss)
  int64_t bytes = 0;   // dry runs: what its forward left alive
};

struct Step {
  int pp_rank;
  Action action;
  double start;  // on the simulated timeline
};

void check_model(const PipelineModel& model, const Schedule& schedule, const DeviceMesh& mesh,
                 int pp) {
  if (mesh.size(pp) != schedule.ranks) {
    throw_error<ConfigError>(
        "run_pipeline: schedule '{}' is for {} pp ranks, mesh dim '{}' of {} has {}", schedule.name,
        schedule.ranks, mesh.dim_name(pp), mesh.to_string(), mesh.size(pp));
  }
  if (static_cast<int>(model.stages.size()) != schedule.stages()) {
    throw_error<ConfigError>(
        "run_pipeline: the model has {} stages, schedule '{}' runs {} ({} pp ranks x {} virtual "
        "stages)",
        model.stages.size(), schedule.name, schedule.stages(), schedule.ranks,
        schedule.virtual_stages);
  }
  if (!model.input) throw_error<ConfigError>("run_pipeline: the model has no input function");
  if (!model.loss) throw_error<ConfigError>("run_pipeline: the model has no loss function");
  for (size_t s = 0; s < model.stages.size(); ++s) {
    if (!model.stages[s].forward) {
      throw_error<ConfigError>("run_pipeline: stage {} has no forward function", s);
    }
  }
}

LocalTensor ones_like(const LocalTensor& t) {
  return t.apply([](const Tensor& x) { return ones(x.shape(), x.dtype(), x.device()); });
}

}  // namespace

std::vector<int> stage_ranks(const DeviceMesh& mesh, MeshDim pp_dim, int pp_rank) {
  const PerRank<int64_t> coordinate = mesh.local_rank(pp_dim);
  std::vector<int> out;
  for (int r : mesh.world().held_ranks()) {
    if (mesh.contains(r) && coordinate.at(r) == pp_rank) out.push_back(r);
  }
  return out;
}

PipelineStep run_pipeline(const PipelineModel& model, const Schedule& schedule,
                          const DeviceMesh& mesh, MeshDim pp_dim, SourceLocation loc) {
  validate(schedule, loc);
  const int pp = mesh.resolve(pp_dim);
  check_model(model, schedule, mesh, pp);
  communicator(mesh, pp);
  const Timeline timeline = simulate(schedule, Costs{}, loc);

  std::vector<std::vector<int>> ranks_of(static_cast<size_t>(schedule.ranks));
  std::vector<Step> order;
  for (int p = 0; p < schedule.ranks; ++p) {
    ranks_of[static_cast<size_t>(p)] = stage_ranks(mesh, pp, p);
    if (ranks_of[static_cast<size_t>(p)].empty()) continue;
    const auto& timed = timeline.per_rank[static_cast<size_t>(p)].actions;
    for (const TimedAction& t : timed) order.push_back(Step{p, t.action, t.start});
  }
  // Under sim every pp rank's actions run in one program: in the timeline's order, where each
  // recv follows its send. Elsewhere this process holds one pp rank: its own order.
  if (mesh.world().backend().is_lockstep()) {
    std::stable_sort(order.begin(), order.end(), [](const Step& a, const Step& b) {
      return std::tie(a.start, a.pp_rank) < std::tie(b.start, b.pp_rank);
    });
  }

  const int last = schedule.stages() - 1;
  const double scale = 1.0 / static_cast<double>(schedule.microbatches);
  std::map<std::pair<int, int>, InFlight> in_flight;
  std::vector<Async<LocalTensor>> sends;
  PipelineStep result;
  result.schedule = schedule;
  const bool measure = meta_tensors();
  std::vector<int64_t> held(static_cast<size_t>(schedule.ranks), 0);
  std::vector<int> pairs(static_cast<size_t>(schedule.ranks), 0);
  if (measure) {
    result.activation_bytes.assign(static_cast<size_t>(schedule.stages()), 0);
    result.peak_activation_bytes.assign(static_cast<size_t>(schedule.ranks), 0);
    result.peak_in_flight.assign(static_cast<size_t>(schedule.ranks), 0);
  }
  // Dry runs: a pair's activations leave the rank's account when its last backward ran.
  auto release = [&](int p, const InFlight& f) {
    if (!measure) return;
    held[static_cast<size_t>(p)] -= f.bytes;
    --pairs[static_cast<size_t>(p)];
  };
  Trace& tr = trace();
  for (const Step& step : order) {
    const Action& a = step.action;
    const int s = a.stage;
    const int m = a.microbatch;
    const std::vector<int>& ranks = ranks_of[static_cast<size_t>(step.pp_rank)];
    const PipelineContextScope context(s, m, kind_letter(a.kind));
    const int64_t start_ns = tr.enabled() ? tr.now_ns() : 0;
    InFlight& f = in_flight[{s, m}];
    const PipelineStage& stage = model.stages[static_cast<size_t>(s)];
    if (a.kind == ActionKind::Forward) {
      const int64_t live_before = measure ? meta_live_bytes() : 0;
      LocalTensor x;
      if (s == 0) {
        x = model.input(m, ranks);
      } else {
        const LocalTensor like = LocalTensor::from_fn(
            ranks, [&](int) { return zeros(stage.input_shape, stage.input_dtype); });
        x = recv(like, mesh, pp, schedule.rank_of_stage(s - 1), m, loc).detach();
        x.requires_grad_(true);
        f.input = x;
      }
      const LocalTensor y = stage.forward(x);
      if (s == last) {
        f.output = model.loss(y, m) * scale;
        const LocalTensor value = f.output.detach();
        result.loss = result.loss.defined() ? result.loss + value : value;
      } else {
        f.output = y;
        sends.push_back(isend(y.detach(), mesh, pp, schedule.rank_of_stage(s + 1), m, loc));
      }
      if (measure) {
        const size_t p = static_cast<size_t>(step.pp_rank);
        f.bytes = std::max<int64_t>(0, meta_live_bytes() - live_before);
        int64_t& per_stage = result.activation_bytes[static_cast<size_t>(s)];
        per_stage = std::max(per_stage, f.bytes);
        held[p] += f.bytes;
        ++pairs[p];
        result.peak_activation_bytes[p] = std::max(result.peak_activation_bytes[p], held[p]);
        result.peak_in_flight[p] = std::max(result.peak_in_flight[p], pairs[p]);
      }
    } else {
      if (!f.output.defined()) {
        throw_error<Error>("run_pipeline: {} on pp rank {} runs before its forward", a,
                           step.pp_rank);
      }
      if (!f.grad.defined()) {
        f.grad =
            s == last
                ? ones_like(f.output)
                : recv(f.output.detach(), mesh, pp, schedule.rank_of_stage(s + 1), m, loc).detach();
      }
      const Var out = local_var(f.output);
      const Var grad = local_var(f.grad);
      auto send_input_grad = [&] {
        if (s == 0) return;
        const LocalTensor g = f.input.grad();
        if (!g.defined()) {
          // Sending zeros would train the earlier stages on nothing, silently.
          throw_error<Error>(
              "run_pipeline: {} on pp rank {}: the stage's output does not depend on its input "
              "(a detach or a to_local without gradient inside stage {}'s forward?), so no "
              "gradient goes back to stage {}",
              a, step.pp_rank, s, s - 1);
        }
        sends.push_back(isend(g, mesh, pp, schedule.rank_of_stage(s - 1), m, loc));
      };
      if (a.kind == ActionKind::Backward) {
        run_backward(out, grad, loc);
        send_input_grad();
        release(step.pp_rank, f);
        in_flight.erase({s, m});
      } else if (a.kind == ActionKind::BackwardInput) {
        if (s > 0) {
          run_backward(out, grad, BackwardOptions{{local_var(f.input)}, true}, loc);
          send_input_grad();
        }
      } else {
        BackwardOptions options;
        for (LocalTensor* p : stage.parameters) options.only.push_back(local_var(*p));
        if (!options.only.empty()) run_backward(out, grad, options, loc);
        release(step.pp_rank, f);
        in_flight.erase({s, m});
      }
    }
    if (tr.enabled()) {
      const int64_t end_ns = tr.now_ns();
      for (int rank : ranks) {
        tr.add_span(ComputeSpan{rank, s, m, kind_letter(a.kind), static_cast<int64_t>(step.start),
                                start_ns, end_ns});
      }
    }
    result.ran.push_back(a);
  }
  for (auto& send : sends) send.wait();
  if (!in_flight.empty()) {
    const auto& [key, f] = *in_flight.begin();
    throw_error<Error>(
        "run_pipeline: schedule '{}' ended with {} (stage, microbatch) pairs whose backward never "
        "ran, the first stage {} microbatch {}: its gradients are missing from the parameters",
        schedule.name, in_flight.size(), key.first, key.second);
  }
  return result;
}

}  // namespace spmd::pipeline
