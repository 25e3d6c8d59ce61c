// The set of forja processes that train one model together (data parallel), or just this one.
//
// `mpirun -np N forja train ...` (or srun, or MPICH's mpiexec) starts N processes; each calls
// World::join(), which notices the launcher from its environment variables, loads the MPI plugin
// (libforja_mpi.so beside the program, see mpi_plugin_api.h) and joins the job. Without a
// launcher join() does nothing and the world is this process alone: every collective below is
// then a no-op, so the trainer runs the same code either way.
//
// Collectives throw std::runtime_error naming the MPI call when MPI reports a failure; the
// program's error path then calls abort_job(), which ends every rank (see cli/main.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

struct forja_mpi_plugin;

namespace forja::dist {

// What started this process, read from the launchers' environment variables.
struct Launch {
  bool by_launcher = false;
  std::string launcher;  // e.g. "Open MPI (mpirun)"; "" without one
  int size_hint = 0;     // the job's size as the launcher announced it; 0 = not announced
};
Launch detect_launch();

class World {
 public:
  static World& get();

  // Joins the MPI job when a launcher started this process; UserError when it did but this
  // build has no MPI plugin (the message says how to get one). Safe to call twice.
  void join();
  // Leaves the job (MPI_Finalize) after a normal end; every rank must call it.
  void leave();
  // Ends the whole job with `code` when distributed (MPI_Abort), else does nothing.
  void abort_job(int code);

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // among the ranks of this machine
  bool is_root() const { return rank_ == 0; }
  bool distributed() const { return size_ > 1; }
  // "2 ranks on 1 machine (Open MPI v4.1.4 ...)"
  std::string describe() const;

  // In place, over all ranks.
  void sum(std::span<float> values);
  void sum(std::span<double> values);
  void max(std::span<int64_t> values);
  void broadcast(void* data, size_t bytes, int root = 0);
  void barrier();

 private:
  World() = default;
  void check(int rc) const;

  const forja_mpi_plugin* plugin_ = nullptr;
  bool joined_ = false, left_ = false;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::string launcher_;
};

}  // namespace forja::dist
