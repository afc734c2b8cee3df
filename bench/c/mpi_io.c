/* Collective MPI-IO bandwidth: every rank writes, then reads, its share of one file through a strided
 * vector view (rank r sees blocks r, r+P, r+2P, ... of --block bytes), with MPI_File_write_at_all and
 * MPI_File_read_at_all at offset 0 (explicit offsets: Debian's MPICH 4.0 does not advance the individual
 * file pointer in MPI_File_write_all, so write_all then read_all would differ between implementations). Built with each implementation's wrapper (MPICH: ROMIO, Open MPI: OMPIO, vmfabric:
 * the MPICH build over its library).
 *
 *   mpi_io [--mb 1024] [--block 16384] [--reps 3] [--dir DIR] [--json-write F] [--json-read F] [--label L]
 *          [--hint KEY=VALUE]...   (info hints given to MPI_File_open, e.g. romio_cb_write=disable)
 *
 * Times are the slowest rank's (a barrier before, the collective call, a barrier after); the best of
 * --reps repetitions is reported as MB/s of the whole file (1 MB = 10^6 bytes). The first repetition
 * checks every byte read back. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void die(const char *m)
{
    fprintf(stderr, "mpi_io: %s\n", m);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

static void json(const char *path, const char *bench, const char *label, long long bytes, long long block,
                 double mbps, double sec)
{
    if (!path)
        return;
    FILE *f = fopen(path, "w");
    if (!f)
        die("cannot write the JSON file");
    fprintf(f, "{\"benchmark\": \"%s\", \"transport\": \"%s\", \"block\": %lld, \"results\": "
               "[{\"size\": %lld, \"mb_per_s\": %.1f, \"seconds\": %.4f}]}\n",
            bench, label, block, bytes, mbps, sec);
    fclose(f);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, np;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    long long mb = 1024, block = 16384;
    int reps = 3;
    const char *dir = "/tmp", *jw = NULL, *jr = NULL, *label = "mpi";
    MPI_Info info;
    MPI_Info_create(&info);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            die("an option lacks its value");
        if (!strcmp(a, "--mb"))
            mb = atoll(v);
        else if (!strcmp(a, "--block"))
            block = atoll(v);
        else if (!strcmp(a, "--reps"))
            reps = atoi(v);
        else if (!strcmp(a, "--dir"))
            dir = v;
        else if (!strcmp(a, "--json-write"))
            jw = v;
        else if (!strcmp(a, "--json-read"))
            jr = v;
        else if (!strcmp(a, "--label"))
            label = v;
        else if (!strcmp(a, "--hint") && strchr(v, '=')) {
            char key[256];
            snprintf(key, sizeof key, "%.*s", (int)(strchr(v, '=') - v), v);
            MPI_Info_set(info, key, strchr(v, '=') + 1);
        }
        else
            die("usage: mpi_io [--mb N] [--block B] [--reps R] [--dir D] [--json-write F] [--json-read F] [--label L] [--hint K=V]...");
        i++;
    }
    long long total = mb << 20;
    if (block <= 0 || reps <= 0 || total % (block * np) != 0)
        die("--mb MiB must be a multiple of --block times the number of ranks");
    long long mine = total / np;
    if (mine > INT32_MAX)
        die("each rank's share must stay below 2 GiB");
    unsigned char *buf = malloc(mine), *in = malloc(mine);
    if (!buf || !in)
        die("out of memory");
    /* Block k of rank r is file block k*P + r; byte j of it holds a function of its file offset. */
    for (long long k = 0; k < mine / block; k++)
        for (long long j = 0; j < block; j++) {
            long long off = (k * np + rank) * block + j;
            buf[k * block + j] = (unsigned char)(off * 7 + (off >> 12));
        }
    char path[512];
    int tag = (int)getpid();
    MPI_Bcast(&tag, 1, MPI_INT, 0, MPI_COMM_WORLD);
    snprintf(path, sizeof path, "%s/vmf-mpi-io-bench-%d", dir, tag);
    MPI_Datatype blk, ft;
    MPI_Type_contiguous((int)block, MPI_BYTE, &blk);
    MPI_Type_create_resized(blk, 0, (MPI_Aint)block * np, &ft);
    MPI_Type_commit(&ft);
    double best_w = 1e30, best_r = 1e30;
    for (int r = 0; r < reps; r++) {
        MPI_File fh;
        if (MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_CREATE | MPI_MODE_RDWR, info, &fh) != MPI_SUCCESS)
            die("MPI_File_open failed");
        MPI_File_set_view(fh, (MPI_Offset)rank * block, MPI_BYTE, ft, "native", MPI_INFO_NULL);
        MPI_Status st;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if (MPI_File_write_at_all(fh, 0, buf, (int)mine, MPI_BYTE, &st) != MPI_SUCCESS)
            die("MPI_File_write_at_all failed");
        MPI_Barrier(MPI_COMM_WORLD);
        double t1 = MPI_Wtime();
        memset(in, 0, mine);
        MPI_Barrier(MPI_COMM_WORLD);
        double t2 = MPI_Wtime();
        if (MPI_File_read_at_all(fh, 0, in, (int)mine, MPI_BYTE, &st) != MPI_SUCCESS)
            die("MPI_File_read_at_all failed");
        MPI_Barrier(MPI_COMM_WORLD);
        double t3 = MPI_Wtime();
        if (r == 0 && memcmp(buf, in, mine) != 0)
            die("the data read back differ from the data written");
        MPI_File_close(&fh);
        if (rank == 0)
            MPI_File_delete(path, MPI_INFO_NULL);
        if (t1 - t0 < best_w)
            best_w = t1 - t0;
        if (t3 - t2 < best_r)
            best_r = t3 - t2;
        MPI_Barrier(MPI_COMM_WORLD);
    }
    if (rank == 0) {
        double w = total / best_w / 1e6, rd = total / best_r / 1e6;
        printf("mpi_io %s: %d ranks, %lld MiB, blocks of %lld B: write_at_all %.1f MB/s (%.3f s), read_at_all %.1f MB/s (%.3f s)\n",
               label, np, mb, block, w, best_w, rd, best_r);
        json(jw, "io-write", label, total, block, w, best_w);
        json(jr, "io-read", label, total, block, rd, best_r);
    }
    MPI_Type_free(&ft);
    MPI_Type_free(&blk);
    MPI_Info_free(&info);
    free(buf);
    free(in);
    MPI_Finalize();
    return 0;
}
