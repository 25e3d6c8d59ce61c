# Sourced at the start of a command on the GPU machine (the `device` tool): unpacks the Vulkan
# loader and the GL vendor-neutral libraries carried in .gl/ (see docs/benchmarks.md; NVIDIA's
# Vulkan driver needs libGLX/libEGL from glvnd on some images, without them vkCreateInstance
# finds no driver) and points the loader at NVIDIA's driver, which that image keeps outside the
# loader's default search paths.
for f in .gl/*.deb; do dpkg -x "$f" / ; done
ldconfig
if [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
# The tests' inputs as bench/prepare_dist.sh carries them: the parity cases and the CLI under test.
export FORJA_PARITY_DIR=$PWD/.dist/parity FORJA_TEST_PROGRAM=$PWD/.dist/forja
