// The V-trace actor-critic loss's gradients with respect to the learner's logits and baselines,
// and the loss's terms, in one op (examples/vtrace/loss.py's output_gradients, which says what
// the loss is). In TorchScript the targets and the gradients take about 150 small tensor ops on
// [T, B] tensors of a few hundred numbers; each op's dispatch costs more than its arithmetic.
// Here they are loops over the T x B steps.

#include <torch/library.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

// log_softmax of n logits into out.
void log_softmax(const float* logits, int64_t n, float* out) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) top = std::max(top, logits[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(logits[i] - top);
  const float log_sum = std::log(sum);
  for (int64_t i = 0; i < n; ++i) out[i] = logits[i] - top - log_sum;
}

const bool* bool_data(const c10::optional<at::Tensor>& tensor) {
  return tensor.has_value() && tensor->defined() ? tensor->data_ptr<bool>() : nullptr;
}

void check(const at::Tensor& tensor, at::ScalarType type, c10::IntArrayRef shape,
           const char* name) {
  TORCH_CHECK(tensor.device().is_cpu() && tensor.scalar_type() == type && tensor.is_contiguous(),
              "vtrace_output_gradients: ", name, " must be a contiguous CPU tensor of ", type);
  TORCH_CHECK(tensor.sizes() == shape, "vtrace_output_gradients: ", name, " must be ", shape,
              ", got ", tensor.sizes());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> vtrace_output_gradients(
    const at::Tensor& logits, const at::Tensor& baselines, const at::Tensor& behavior_logits,
    const at::Tensor& actions, const at::Tensor& rewards, const at::Tensor& dones,
    const c10::optional<at::Tensor>& truncated, const c10::optional<at::Tensor>& life_lost,
    double reward_clip, double discounting, double vtrace_lambda, double pg_clip,
    bool normalize_advantages, double baseline_cost, double entropy_weight) {
  TORCH_CHECK(logits.dim() == 3 && logits.size(0) >= 2,
              "vtrace_output_gradients: logits must be [T + 1, B, A] with T >= 1");
  const int64_t T = logits.size(0) - 1, B = logits.size(1), A = logits.size(2);
  check(logits, at::kFloat, {T + 1, B, A}, "logits");
  check(behavior_logits, at::kFloat, {T + 1, B, A}, "behavior_logits");
  check(baselines, at::kFloat, {T + 1, B}, "baselines");
  check(actions, at::kLong, {T + 1, B}, "actions");
  check(rewards, at::kFloat, {T + 1, B}, "rewards");
  check(dones, at::kBool, {T + 1, B}, "dones");
  for (const auto* optional : {&truncated, &life_lost})
    if (optional->has_value() && (*optional)->defined())
      check(**optional, at::kBool, {T + 1, B}, "truncated and life_lost");

  const float* target = logits.data_ptr<float>();
  const float* behavior = behavior_logits.data_ptr<float>();
  const float* values = baselines.data_ptr<float>();
  const int64_t* action = actions.data_ptr<int64_t>();
  const float* reward = rewards.data_ptr<float>();
  const bool* done = dones.data_ptr<bool>();
  const bool* cut = bool_data(truncated);
  const bool* lost = bool_data(life_lost);
  const int64_t steps = T * B;
  for (int64_t i = 0; i < steps; ++i)
    TORCH_CHECK(action[i] >= 0 && action[i] < A, "vtrace_output_gradients: action ", action[i],
                " is outside [0, ", A, ")");

  // Step t's transition: its reward, discount, whether it is real, and the importance weight.
  std::vector<float> log_policy(steps * A), behavior_log_probs(A), rhos(steps), log_rhos(steps),
      discounts(steps), clipped_rewards(steps), masks(steps);
  for (int64_t i = 0; i < steps; ++i) {
    float r = reward[i + B];
    if (reward_clip != 0)
      r = std::min(std::max(r, static_cast<float>(-reward_clip)), static_cast<float>(reward_clip));
    clipped_rewards[i] = r;
    const bool ends = done[i + B] || (lost != nullptr && lost[i + B]);
    discounts[i] = ends ? 0.0f : static_cast<float>(discounting);
    masks[i] = cut != nullptr && cut[i] ? 0.0f : 1.0f;
    log_softmax(target + i * A, A, log_policy.data() + i * A);
    log_softmax(behavior + i * A, A, behavior_log_probs.data());
    log_rhos[i] = log_policy[i * A + action[i]] - behavior_log_probs[action[i]];
    rhos[i] = std::exp(log_rhos[i]);
  }

  // vs_s - V(x_s) = delta_s + gamma_s c_s (vs_{s+1} - V(x_{s+1})), backwards from the bootstrap.
  std::vector<float> vs(steps), advantages(steps), pg_advantages(steps);
  const float* bootstrap = values + T * B;
  for (int64_t b = 0; b < B; ++b) {
    float later = 0.0f;  // vs - V of the step after
    for (int64_t t = T - 1; t >= 0; --t) {
      const int64_t i = t * B + b;
      const float next_value = t + 1 < T ? values[i + B] : bootstrap[b];
      const float clipped_rho = std::min(rhos[i], 1.0f) * masks[i];
      const float trace = static_cast<float>(vtrace_lambda) * std::min(rhos[i], 1.0f) * masks[i];
      const float delta =
          clipped_rho * (clipped_rewards[i] + discounts[i] * next_value - values[i]);
      later = delta + discounts[i] * trace * later;
      vs[i] = later + values[i];
    }
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = t * B + b;
      const float next_vs = t + 1 < T ? vs[i + B] : bootstrap[b];
      advantages[i] = (clipped_rewards[i] + discounts[i] * next_vs - values[i]) * masks[i];
      pg_advantages[i] = std::min(rhos[i], 1.0f) * masks[i] * advantages[i];
    }
  }

  std::vector<float>& policy_advantages = pg_clip > 0 ? advantages : pg_advantages;
  const bool masked = cut != nullptr;
  if (normalize_advantages) {
    double sum = 0.0, count = 0.0;
    for (int64_t i = 0; i < steps; ++i) {
      if (masks[i] != 0.0f) {
        sum += policy_advantages[i];
        count += 1.0;
      }
    }
    if (count >= 2) {
      const double mean = sum / count;
      double squares = 0.0;
      for (int64_t i = 0; i < steps; ++i)
        if (masks[i] != 0.0f) {
          const double deviation = policy_advantages[i] - mean;
          squares += deviation * deviation;
        }
      const float spread = static_cast<float>(std::sqrt(squares / (count - 1))) + 1e-8f;
      for (int64_t i = 0; i < steps; ++i) {
        policy_advantages[i] = (policy_advantages[i] - static_cast<float>(mean)) / spread;
        if (masked) policy_advantages[i] *= masks[i];
      }
    }
  }

  auto grad_logits = at::zeros_like(logits);
  auto grad_baselines = at::zeros_like(baselines);
  float* grad_l = grad_logits.data_ptr<float>();
  float* grad_v = grad_baselines.data_ptr<float>();
  const float scale = 1.0f / static_cast<float>(steps);
  const float low = static_cast<float>(1 - pg_clip), high = static_cast<float>(1 + pg_clip);
  double pg_loss = 0.0, value_loss = 0.0, negative_entropy = 0.0, outside = 0.0, real = 0.0;
  for (int64_t i = 0; i < steps; ++i) {
    const float advantage = policy_advantages[i];
    // The policy's loss is -sum(weight * log pi(a)) for constant weights: the advantage, or for
    // the clipped surrogate the ratio times the advantage where its unclipped side is the
    // minimum (elsewhere the clipped side is flat in the ratio).
    float weight;
    if (pg_clip > 0) {
      const float unclipped = rhos[i] * advantage;
      const float clipped = std::min(std::max(rhos[i], low), high) * advantage;
      pg_loss -= std::min(unclipped, clipped) * masks[i];
      weight = unclipped <= clipped ? unclipped * masks[i] : 0.0f;
      if (masks[i] != 0.0f) {
        outside += std::abs(rhos[i] - 1.0f) > static_cast<float>(pg_clip);
        real += 1.0;
      }
    } else {
      pg_loss -= log_policy[i * A + action[i]] * advantage;
      weight = advantage;
    }
    const float* logp = log_policy.data() + i * A;
    float entropy_sum = 0.0f;  // sum of pi log pi
    for (int64_t a = 0; a < A; ++a) entropy_sum += std::exp(logp[a]) * logp[a];
    negative_entropy += entropy_sum * masks[i];
    const float entropy_scale = static_cast<float>(entropy_weight) * masks[i];
    float* grad = grad_l + i * A;
    // d log pi(a) / d logits = onehot(a) - pi; d sum(pi log pi) / d logits = pi (log pi - that).
    for (int64_t a = 0; a < A; ++a) {
      const float p = std::exp(logp[a]);
      grad[a] = (p * weight + entropy_scale * p * (logp[a] - entropy_sum)) * scale;
    }
    grad[action[i]] -= weight * scale;
    const float error = vs[i] - values[i];
    value_loss += 0.5 * error * error;
    grad_v[i] = -static_cast<float>(baseline_cost) * error * scale;
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double clip_fraction = pg_clip > 0 && real > 0 ? outside / real : nan;
  auto terms = at::tensor(
      {static_cast<float>(pg_loss / steps), static_cast<float>(value_loss / steps),
       static_cast<float>(negative_entropy / steps), static_cast<float>(clip_fraction)},
      logits.options());
  return {grad_logits, grad_baselines, terms};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(moolib_examples, m) {
  m.def(
      "vtrace_output_gradients(Tensor logits, Tensor baselines, Tensor behavior_logits, "
      "Tensor actions, Tensor rewards, Tensor dones, Tensor? truncated, Tensor? life_lost, "
      "float reward_clip, float discounting, float vtrace_lambda, float pg_clip, "
      "bool normalize_advantages, float baseline_cost, float entropy_weight) "
      "-> (Tensor, Tensor, Tensor)");
  m.impl("vtrace_output_gradients", c10::DispatchKey::CPU, TORCH_FN(vtrace_output_gradients));
}
