/* MPI_Allreduce bus bandwidth, the peer of allreduce_bench.cc: same sizes, same float32 sum,
 * same busbw definition. Usage: mpirun -np 2 mpi_allreduce_bench ITERS WARMUP MIB[,MIB...] [OP]
 * With OP "sendrecv" (2 ranks) it times MPI_Sendrecv of the same bytes both ways instead, and
 * reports bytes / time, as allreduce_bench --op sendrecv does. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int iters = argc > 1 ? atoi(argv[1]) : 20;
  int warmup = argc > 2 ? atoi(argv[2]) : 5;
  char sizes[256] = "1,16,64";
  if (argc > 3) snprintf(sizes, sizeof(sizes), "%s", argv[3]);
  const int sendrecv = argc > 4 && strcmp(argv[4], "sendrecv") == 0;
  const int peer = 1 - rank;
  for (char* item = strtok(sizes, ","); item != NULL; item = strtok(NULL, ",")) {
    size_t count = (size_t)(atof(item) * (1 << 20)) / sizeof(float);
    float* data = malloc(count * sizeof(float));
    float* received = malloc(count * sizeof(float));
    for (size_t i = 0; i < count; ++i) data[i] = 1.0f;
    double start = 0;
    for (int i = 0; i < warmup + iters; ++i) {
      if (i == warmup) {
        MPI_Barrier(MPI_COMM_WORLD);
        start = MPI_Wtime();
      }
      if (sendrecv) {
        MPI_Sendrecv(data, (int)count, MPI_FLOAT, peer, 0, received, (int)count, MPI_FLOAT, peer,
                     0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        MPI_Allreduce(MPI_IN_PLACE, data, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      }
    }
    double seconds = (MPI_Wtime() - start) / iters;
    if (rank == 0) {
      double bytes = (double)count * sizeof(float);
      printf("%zu %.6f %.3f\n", count * sizeof(float), seconds,
             (sendrecv ? 1.0 : 2.0 * (size - 1) / size) * bytes / seconds / 1e9);
      fflush(stdout);
    }
    free(received);
    free(data);
  }
  MPI_Finalize();
  return 0;
}
