// gpu/spirv_interface.h: the bindings and push-constant bytes read from the embedded kernels match
// what their GLSL declares (counted by hand below), and what is not SPIR-V is refused. The kernel
// table generated from them at build time (kernels/kernel_table.h) names every embedded kernel
// once, with the interface read from its module.
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/spirv_interface.h"
#include "kernels/kernel_table.h"
#include "kernels/spirv.h"

namespace forja::gpu {
namespace {

SpirvInterface of(const char* variant) {
  const kernels::Spirv* spv = kernels::find_spirv(variant);
  if (!spv) throw std::runtime_error(std::string("no kernel ") + variant);
  return spirv_interface(spv->words, spv->word_count, variant);
}

TEST(SpirvInterface, ReadsBindingsAndPushConstantBytes) {
  // to_f16_block.comp: src, dst (+ flags when checked); 7 uints, a float, 3 uints = 44 bytes
  EXPECT_EQ(of("to_f16_block").bindings, 2u);
  EXPECT_EQ(of("to_f16_block").push_bytes, 44u);
  EXPECT_EQ(of("to_f16_block_checked").bindings, 3u);
  EXPECT_EQ(of("to_f16_block_checked").push_bytes, 44u);
  // elementwise.comp: {uint n; float alpha; uint flag;}; add binds a, b, y; swiglu_bwd five
  EXPECT_EQ(of("ew_add").bindings, 3u);
  EXPECT_EQ(of("ew_add").push_bytes, 12u);
  EXPECT_EQ(of("ew_swiglu_bwd").bindings, 5u);
  EXPECT_EQ(of("ew_to_f16_checked").bindings, 3u);
}

TEST(SpirvInterface, RefusesWhatIsNotSpirv) {
  const std::vector<uint32_t> junk = {1, 2, 3, 4, 5, 6};
  EXPECT_THROW(spirv_interface(junk.data(), junk.size(), "junk"), std::runtime_error);
  // a valid header whose first instruction claims more words than there are
  const std::vector<uint32_t> cut = {0x07230203u, 0x00010000u, 0, 10, 0, (9u << 16) | 17u};
  EXPECT_THROW(spirv_interface(cut.data(), cut.size(), "cut"), std::runtime_error);
}

TEST(KernelTable, NamesEveryEmbeddedKernelWithItsInterface) {
  std::set<std::string> names;
  for (const kernels::Kernel* k : kernels::all_kernels) {
    EXPECT_TRUE(names.insert(k->name).second) << k->name << " is in the table twice";
    const kernels::Spirv* spv = kernels::find_spirv(k->name);
    EXPECT_EQ(spv != nullptr, k->built) << k->name;
    if (!spv) continue;
    const SpirvInterface iface = spirv_interface(spv->words, spv->word_count, k->name);
    EXPECT_EQ(iface.bindings, k->bindings) << k->name;
    EXPECT_EQ(iface.push_bytes, k->push_bytes) << k->name;
  }
  for (const kernels::Spirv& s : kernels::all_spirv()) EXPECT_TRUE(names.count(s.name)) << s.name << " is not in the table";
  // A hand count, as above: the table is what the shader declares.
  EXPECT_EQ(kernels::to_f16_block_checked.bindings, 3u);
  EXPECT_EQ(kernels::to_f16_block_checked.push_bytes, 44u);
  EXPECT_TRUE(kernels::to_f16_block_checked.built);
}

}  // namespace
}  // namespace forja::gpu
