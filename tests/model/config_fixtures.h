// config.json texts with the shapes of real checkpoints (docs/formats.md §1.1, §1.7), shared by
// the config, memory-plan and adapter tests.
#pragma once
#include <string>

namespace forja::test {

inline std::string qwen3_config(int hidden, int intermediate, int layers, int heads, bool tied) {
  return R"({"architectures":["Qwen3ForCausalLM"],"attention_bias":false,"attention_dropout":0.0,
    "bos_token_id":151643,"eos_token_id":151645,"head_dim":128,"hidden_act":"silu",
    "hidden_size":)" +
         std::to_string(hidden) + R"(,"initializer_range":0.02,"intermediate_size":)" +
         std::to_string(intermediate) + R"(,"max_position_embeddings":40960,"max_window_layers":28,
    "model_type":"qwen3","num_attention_heads":)" +
         std::to_string(heads) + R"(,"num_hidden_layers":)" + std::to_string(layers) +
         R"(,"num_key_value_heads":8,
    "rms_norm_eps":1e-06,"rope_scaling":null,"rope_theta":1000000,"sliding_window":null,
    "tie_word_embeddings":)" +
         (tied ? "true" : "false") + R"(,"torch_dtype":"bfloat16",
    "transformers_version":"4.51.0","use_cache":true,"use_sliding_window":false,"vocab_size":151936})";
}

inline std::string qwen3_0_6b() { return qwen3_config(1024, 3072, 28, 16, true); }
inline std::string qwen3_1_7b() { return qwen3_config(2048, 6144, 28, 16, true); }
inline std::string qwen3_4b() { return qwen3_config(2560, 9728, 36, 32, true); }
inline std::string qwen3_8b() { return qwen3_config(4096, 12288, 36, 32, false); }

inline std::string qwen2_5_0_5b() {
  return R"({"architectures":["Qwen2ForCausalLM"],"attention_dropout":0.0,"bos_token_id":151643,
    "eos_token_id":151643,"hidden_act":"silu","hidden_size":896,"initializer_range":0.02,
    "intermediate_size":4864,"max_position_embeddings":32768,"max_window_layers":24,
    "model_type":"qwen2","num_attention_heads":14,"num_hidden_layers":24,"num_key_value_heads":2,
    "rms_norm_eps":1e-06,"rope_theta":1000000.0,"sliding_window":32768,"tie_word_embeddings":true,
    "torch_dtype":"bfloat16","use_cache":true,"use_sliding_window":false,"vocab_size":151936})";
}

inline std::string llama3_1_8b() {
  return R"({"architectures":["LlamaForCausalLM"],"attention_bias":false,"attention_dropout":0.0,
    "bos_token_id":128000,"eos_token_id":[128001,128008,128009],"hidden_act":"silu",
    "hidden_size":4096,"initializer_range":0.02,"intermediate_size":14336,
    "max_position_embeddings":131072,"mlp_bias":false,"model_type":"llama","num_attention_heads":32,
    "num_hidden_layers":32,"num_key_value_heads":8,"pretraining_tp":1,"rms_norm_eps":1e-05,
    "rope_scaling":{"factor":8.0,"high_freq_factor":4.0,"low_freq_factor":1.0,
    "original_max_position_embeddings":8192,"rope_type":"llama3"},"rope_theta":500000.0,
    "tie_word_embeddings":false,"torch_dtype":"bfloat16","use_cache":true,"vocab_size":128256})";
}

inline std::string mistral_7b() {
  return R"({"architectures":["MistralForCausalLM"],"bos_token_id":1,"eos_token_id":2,
    "hidden_act":"silu","hidden_size":4096,"initializer_range":0.02,"intermediate_size":14336,
    "max_position_embeddings":32768,"model_type":"mistral","num_attention_heads":32,
    "num_hidden_layers":32,"num_key_value_heads":8,"rms_norm_eps":1e-05,"rope_theta":10000.0,
    "sliding_window":4096,"tie_word_embeddings":false,"torch_dtype":"bfloat16","vocab_size":32000})";
}

}  // namespace forja::test
