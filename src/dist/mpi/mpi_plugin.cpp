// libforja_mpi.so: forja's collective operations on MPI (see ../mpi_plugin_api.h). Built only
// when CMake finds MPI; loaded by dist::World when an MPI launcher started forja.
#include <mpi.h>

#include <climits>
#include <cstring>
#include <string>

#include "dist/mpi_plugin_api.h"

namespace {

std::string g_error;
char g_version[MPI_MAX_LIBRARY_VERSION_STRING] = "";

int check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return 0;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  g_error = std::string(what) + ": " + std::string(text, size_t(len));
  return rc;
}

int init(int* rank, int* size, int* local_rank, int* local_size) {
  int provided = 0;
  // FUNNELED: only the main thread calls MPI (the data-loading thread never does).
  if (int rc = check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread")) return rc;
  // Errors come back to forja, which names the rank and aborts the job itself.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (int rc = check(MPI_Comm_rank(MPI_COMM_WORLD, rank), "MPI_Comm_rank")) return rc;
  if (int rc = check(MPI_Comm_size(MPI_COMM_WORLD, size), "MPI_Comm_size")) return rc;
  MPI_Comm node;
  if (int rc = check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
                     "MPI_Comm_split_type"))
    return rc;
  MPI_Comm_rank(node, local_rank);
  MPI_Comm_size(node, local_size);
  MPI_Comm_free(&node);
  return 0;
}

// MPI counts are int: reduce in pieces of at most 2^30 elements.
template <class T>
int allreduce(T* data, size_t count, MPI_Datatype type, MPI_Op op, const char* what) {
  constexpr size_t kPiece = size_t(1) << 30;
  for (size_t done = 0; done < count; done += kPiece) {
    const int n = int(count - done < kPiece ? count - done : kPiece);
    if (int rc = check(MPI_Allreduce(MPI_IN_PLACE, data + done, n, type, op, MPI_COMM_WORLD), what)) return rc;
  }
  return 0;
}

int allreduce_sum_f32(float* d, size_t n) { return allreduce(d, n, MPI_FLOAT, MPI_SUM, "MPI_Allreduce (float sum)"); }
int allreduce_sum_f64(double* d, size_t n) { return allreduce(d, n, MPI_DOUBLE, MPI_SUM, "MPI_Allreduce (double sum)"); }
int allreduce_max_i64(int64_t* d, size_t n) {
  return allreduce(d, n, MPI_INT64_T, MPI_MAX, "MPI_Allreduce (int64 max)");
}

int broadcast(void* data, size_t bytes, int root) {
  constexpr size_t kPiece = size_t(1) << 30;
  char* p = static_cast<char*>(data);
  for (size_t done = 0; done < bytes; done += kPiece) {
    const int n = int(bytes - done < kPiece ? bytes - done : kPiece);
    if (int rc = check(MPI_Bcast(p + done, n, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast")) return rc;
  }
  return 0;
}

int barrier() { return check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
void abort_job(int code) { MPI_Abort(MPI_COMM_WORLD, code); }
int finalize() { return check(MPI_Finalize(), "MPI_Finalize"); }
const char* last_error() { return g_error.c_str(); }
const char* library_version() {
  int len = 0;
  if (!g_version[0]) MPI_Get_library_version(g_version, &len);
  // Keep the first line only ("Open MPI v4.1.4, package: ...").
  if (char* nl = std::strchr(g_version, '\n')) *nl = 0;
  return g_version;
}

const forja_mpi_plugin kPlugin = {FORJA_MPI_PLUGIN_VERSION, init,    allreduce_sum_f32, allreduce_sum_f64,
                                  allreduce_max_i64,        broadcast, barrier,           abort_job,
                                  finalize,                 last_error, library_version};

}  // namespace

extern "C" __attribute__((visibility("default"))) const forja_mpi_plugin* forja_mpi_plugin_get(void) {
  return &kPlugin;
}
