/* An ordinary MPI program with MPI_THREAD_MULTIPLE: two threads reduce at once, each on its
 * own duplicate of MPI_COMM_WORLD that carries hints (cgx_bits 4, cgx_min_bytes 64k),
 * while the main thread reduces on a third, without hints. The buffers are constant on each
 * rank (rank + 1), so every correct sum, compressed or not (a constant bucket is reproduced
 * exactly), is p (p + 1) / 2 everywhere. Rank 0 prints "PASS threads" or "FAIL ...". */
#include <mpi.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

enum { n = 300000, calls = 5 };
static int rank, size;

struct job {
  MPI_Comm comm;
  int bad;
};

static void* reduce(void* arg) {
  struct job* j = (struct job*)arg;
  float* buf = malloc(n * sizeof(float));
  for (int c = 0; c < calls; ++c) {
    for (int i = 0; i < n; ++i) buf[i] = (float)(rank + 1);
    if (MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, j->comm) != MPI_SUCCESS) ++j->bad;
    for (int i = 0; i < n; ++i) j->bad += buf[i] != (float)(size * (size + 1) / 2);
  }
  free(buf);
  return NULL;
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (provided < MPI_THREAD_MULTIPLE) {
    if (rank == 0) printf("PASS threads (skipped: MPI gives no MPI_THREAD_MULTIPLE)\n");
    MPI_Finalize();
    return 0;
  }
  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "cgx_bits", "4");
  MPI_Info_set(info, "cgx_min_bytes", "64k");
  struct job jobs[3];
  for (int t = 0; t < 2; ++t) {
    MPI_Comm_dup_with_info(MPI_COMM_WORLD, info, &jobs[t].comm);
    jobs[t].bad = 0;
  }
  MPI_Info_free(&info);
  MPI_Comm_dup(MPI_COMM_WORLD, &jobs[2].comm);
  jobs[2].bad = 0;
  pthread_t th[2];
  for (int t = 0; t < 2; ++t) pthread_create(&th[t], NULL, reduce, &jobs[t]);
  reduce(&jobs[2]);
  for (int t = 0; t < 2; ++t) pthread_join(th[t], NULL);
  int bad = jobs[0].bad + jobs[1].bad + jobs[2].bad, all = 0;
  MPI_Allreduce(&bad, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf(all == 0 ? "PASS threads\n" : "FAIL: %d wrong values or errors\n", all);
  for (int t = 0; t < 3; ++t) MPI_Comm_free(&jobs[t].comm);
  MPI_Finalize();
  return 0;
}
