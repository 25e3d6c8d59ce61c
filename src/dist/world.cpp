#include "dist/world.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "dist/mpi_plugin_api.h"
#include "util/error.h"

namespace forja::dist {
namespace fs = std::filesystem;

namespace {

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end ? -1 : int(n);
}

// The plugin beside the program (build/ and an installed bin/ alike), else the loader's path.
const forja_mpi_plugin* load_plugin(std::string& tried) {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("FORJA_MPI_PLUGIN"); p && *p) candidates.push_back(p);
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back((self.parent_path() / "libforja_mpi.so").string());
    candidates.push_back((self.parent_path().parent_path() / "lib" / "libforja_mpi.so").string());
  }
  candidates.push_back("libforja_mpi.so");
  for (const auto& c : candidates) {
    void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
      tried += (tried.empty() ? "" : "; ") + std::string(dlerror());
      continue;
    }
    auto get = reinterpret_cast<const forja_mpi_plugin* (*)()>(dlsym(h, "forja_mpi_plugin_get"));
    if (!get) {
      tried += (tried.empty() ? "" : "; ") + c + ": not a forja MPI plugin";
      continue;
    }
    const forja_mpi_plugin* p = get();
    if (p->version != FORJA_MPI_PLUGIN_VERSION) {
      tried += (tried.empty() ? "" : "; ") + c + ": plugin version " + std::to_string(p->version) + ", this forja needs " +
               std::to_string(FORJA_MPI_PLUGIN_VERSION) + " (rebuild)";
      continue;
    }
    return p;
  }
  return nullptr;
}

}  // namespace

Launch detect_launch() {
  Launch l;
  if (int n = env_int("OMPI_COMM_WORLD_SIZE"); n >= 0) {
    l = {true, "Open MPI (mpirun)", n};
  } else if (int n = env_int("PMI_SIZE"); n >= 0) {
    l = {true, "a PMI launcher (mpiexec, srun)", n};
  } else if (std::getenv("PMIX_RANK")) {
    l = {true, "a PMIx launcher (srun --mpi=pmix, prterun)", 0};
  } else if (int n = env_int("SLURM_NTASKS"); n > 1 && std::getenv("SLURM_PROCID")) {
    l = {true, "srun", n};
  }
  return l;
}

World& World::get() {
  static World world;
  return world;
}

void World::check(int rc) const {
  if (rc != 0)
    throw std::runtime_error("rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " +
                             plugin_->last_error());
}

void World::join() {
  if (joined_) return;
  joined_ = true;
  const Launch l = detect_launch();
  if (!l.by_launcher) return;
  launcher_ = l.launcher;
  std::string tried;
  plugin_ = load_plugin(tried);
  if (!plugin_)
    throw UserError("started by " + l.launcher + ", but this forja has no MPI plugin (" + tried +
                    "); install MPI (Debian: libopenmpi-dev openmpi-bin) and rebuild, so build/libforja_mpi.so "
                    "lies beside build/forja, or run forja without the launcher");
  if (int rc = plugin_->init(&rank_, &size_, &local_rank_, &local_size_)) {
    const std::string why = plugin_->last_error();
    plugin_ = nullptr;
    throw std::runtime_error("MPI could not start (" + why + "; error " + std::to_string(rc) + ")");
  }
}

void World::leave() {
  if (!plugin_ || left_) return;
  left_ = true;
  plugin_->finalize();
}

void World::abort_job(int code) {
  if (plugin_ && !left_ && size_ > 1) plugin_->abort_job(code);
}

std::string World::describe() const {
  if (!plugin_) return "1 process";
  const int machines_hint = local_size_ > 0 ? (size_ + local_size_ - 1) / local_size_ : 1;
  return std::to_string(size_) + (size_ == 1 ? " rank" : " ranks") + " (" + std::to_string(local_size_) +
         " on this machine" + (machines_hint > 1 ? ", about " + std::to_string(machines_hint) + " machines" : "") +
         "), started by " + launcher_ + ", " + plugin_->library_version();
}

void World::sum(std::span<float> v) {
  if (plugin_ && size_ > 1) check(plugin_->allreduce_sum_f32(v.data(), v.size()));
}
void World::sum(std::span<double> v) {
  if (plugin_ && size_ > 1) check(plugin_->allreduce_sum_f64(v.data(), v.size()));
}
void World::max(std::span<int64_t> v) {
  if (plugin_ && size_ > 1) check(plugin_->allreduce_max_i64(v.data(), v.size()));
}
void World::broadcast(void* data, size_t bytes, int root) {
  if (plugin_ && size_ > 1) check(plugin_->broadcast(data, bytes, root));
}
void World::barrier() {
  if (plugin_ && size_ > 1) check(plugin_->barrier());
}

}  // namespace forja::dist
