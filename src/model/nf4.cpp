// NF4 for checkpoints (model/nf4.h): the codec (quant/nf4.h) fed from mapped safetensors.
#include "model/nf4.h"

#include <span>
#include <vector>

#include "util/error.h"

namespace forja::model {

quant::Nf4Tensor nf4_quantize_tensor(const io::TensorView& tensor, const quant::Nf4Options& options) {
  return quant::nf4_quantize(
      tensor.shape(), [&](std::int64_t first, std::span<float> out) { tensor.to_float(out, first); }, options);
}

void quantize_checkpoint_linears(const io::SafetensorsCheckpoint& checkpoint,
                                 const ModelConfig& config, const quant::Nf4Options& options,
                                 const std::function<void(const std::string&, quant::Nf4Tensor&&)>& sink) {
  for (std::int64_t layer = 0; layer < config.num_layers; ++layer) {
    for (LinearKind k : kAllLinears) {
      const std::string name = linear_path(layer, k) + ".weight";
      const LinearShape s = linear_shape(config, k);
      io::TensorView view = checkpoint.tensor(name);
      const std::vector<std::int64_t> want = {s.out_features, s.in_features};
      if (view.shape() != want) {
        auto text = [](const std::vector<std::int64_t>& v) {
          std::string r = "[";
          for (std::size_t i = 0; i < v.size(); ++i) r += (i ? ", " : "") + std::to_string(v[i]);
          return r + "]";
        };
        throw UserError("checkpoint tensor '" + name + "' has shape " + text(view.shape()) +
                        " but config.json implies " + text(want) +
                        "; the weights and config.json belong to different models");
      }
      quant::Nf4Tensor quantised = nf4_quantize_tensor(view, options);
      checkpoint.release(name);  // its bf16 pages are done with: keep the resident set small
      sink(name, std::move(quantised));
    }
  }
}

}  // namespace forja::model
