// The C interface between forja and its MPI plugin (libforja_mpi.so, built from src/dist/mpi/
// when an MPI implementation is installed). forja itself never links MPI: it loads the plugin
// with dlopen only when an MPI launcher started it, so one binary runs without MPI installed
// (single process) and under mpirun/srun (data-parallel) alike, and copying build/forja to a
// machine without MPI still works.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FORJA_MPI_PLUGIN_VERSION 1

// Every call returns 0 on success, else an MPI error code (its text in the plugin's last error).
struct forja_mpi_plugin {
  int version;  // FORJA_MPI_PLUGIN_VERSION
  // MPI_Init_thread (funneled) and the job's shape; local_rank is the rank among the processes
  // of this node (MPI_COMM_TYPE_SHARED), which picks the GPU.
  int (*init)(int* rank, int* size, int* local_rank, int* local_size);
  // In-place sums / maxima over all ranks (any count: split below MPI's int limit).
  int (*allreduce_sum_f32)(float* data, size_t count);
  int (*allreduce_sum_f64)(double* data, size_t count);
  int (*allreduce_max_i64)(int64_t* data, size_t count);
  int (*broadcast)(void* data, size_t bytes, int root);
  int (*barrier)(void);
  // MPI_Abort(MPI_COMM_WORLD, code): ends every rank of the job.
  void (*abort_job)(int code);
  int (*finalize)(void);
  // Text of the last failure ("" if none); valid until the next call.
  const char* (*last_error)(void);
  // The MPI library's own version string (MPI_Get_library_version).
  const char* (*library_version)(void);
};

// The plugin's one exported symbol.
const struct forja_mpi_plugin* forja_mpi_plugin_get(void);

#ifdef __cplusplus
}
#endif
