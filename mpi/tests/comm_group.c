/* Communicators, groups, attributes (with copy/delete callbacks), names, split_type. */
#include "check.h"

static int copies, deletes;
static int copy_cb(MPI_Comm c, int k, void *extra, void *in, void *out, int *flag)
{
    (void)c; (void)k;
    CHECK(extra == (void *)&copies);
    copies++;
    *(void **)out = (void *)((char *)in + 1);
    *flag = 1;
    return MPI_SUCCESS;
}
static int delete_cb(MPI_Comm c, int k, void *val, void *extra)
{
    (void)c; (void)k; (void)val; (void)extra;
    deletes++;
    return MPI_SUCCESS;
}

/* sum of ranks over comm via p2p ring (checks the communicator's point-to-point context) */
static void ring_check(MPI_Comm comm)
{
    int r, n, v = -1;
    MPI_Comm_rank(comm, &r);
    MPI_Comm_size(comm, &n);
    MPI_Sendrecv(&r, 1, MPI_INT, (r + 1) % n, 5, &v, 1, MPI_INT, (r + n - 1) % n, 5, comm, MPI_STATUS_IGNORE);
    CHECK(v == (r + n - 1) % n);
    int s = 0;
    MPI_Allreduce(&r, &s, 1, MPI_INT, MPI_SUM, comm);
    CHECK(s == n * (n - 1) / 2);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check_rank = rank;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);

    /* dup */
    MPI_Comm d;
    MPI_Comm_dup(MPI_COMM_WORLD, &d);
    int res;
    MPI_Comm_compare(MPI_COMM_WORLD, d, &res);
    CHECK(res == MPI_CONGRUENT);
    MPI_Comm_compare(d, d, &res);
    CHECK(res == MPI_IDENT);
    ring_check(d);
    /* messages on d and WORLD do not mix */
    if (size > 1) {
        int a = 1, b = 2, x = 0, y = 0;
        if (rank == 0) {
            MPI_Send(&a, 1, MPI_INT, 1, 0, d);
            MPI_Send(&b, 1, MPI_INT, 1, 0, MPI_COMM_WORLD);
        } else if (rank == 1) {
            MPI_Recv(&y, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Recv(&x, 1, MPI_INT, 0, 0, d, MPI_STATUS_IGNORE);
            CHECK(x == 1 && y == 2);
        }
    }
    char name[MPI_MAX_OBJECT_NAME];
    int len;
    MPI_Comm_get_name(MPI_COMM_WORLD, name, &len);
    CHECK(strcmp(name, "MPI_COMM_WORLD") == 0 && len == 14);
    MPI_Comm_set_name(d, "dupcomm");
    MPI_Comm_get_name(d, name, &len);
    CHECK(strcmp(name, "dupcomm") == 0);
    int flag;
    MPI_Comm_test_inter(d, &flag);
    CHECK(flag == 0);

    /* attributes */
    int key, key2;
    MPI_Comm_create_keyval(copy_cb, delete_cb, &key, &copies);
    MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, MPI_COMM_NULL_DELETE_FN, &key2, NULL);
    static char base[16];
    MPI_Comm_set_attr(d, key, base);
    MPI_Comm_set_attr(d, key2, base + 5);
    void *v;
    MPI_Comm_get_attr(d, key, &v, &flag);
    CHECK(flag && v == base);
    MPI_Comm d2;
    MPI_Comm_dup(d, &d2);
    CHECK(copies == 1);
    MPI_Comm_get_attr(d2, key, &v, &flag);
    CHECK(flag && v == base + 1);
    MPI_Comm_get_attr(d2, key2, &v, &flag);
    CHECK(!flag);
    MPI_Comm_set_attr(d2, key, base + 3); /* replaces: delete callback on old value */
    CHECK(deletes == 1);
    MPI_Comm_delete_attr(d2, key);
    CHECK(deletes == 2);
    MPI_Comm_get_attr(d2, key, &v, &flag);
    CHECK(!flag);
    int *tagub;
    MPI_Comm_get_attr(d2, MPI_TAG_UB, &tagub, &flag);
    CHECK(flag && *tagub >= 32767);
    MPI_Comm_free(&d2);
    CHECK(d2 == MPI_COMM_NULL);
    MPI_Comm_free(&d); /* runs delete callback on key */
    CHECK(deletes == 3);
    MPI_Comm_free_keyval(&key);
    MPI_Comm_free_keyval(&key2);

    /* split: parity, reversed order by key */
    MPI_Comm s;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, size - rank, &s);
    int sr, ss;
    MPI_Comm_rank(s, &sr);
    MPI_Comm_size(s, &ss);
    CHECK(ss == (size + 1 - rank % 2) / 2);
    int members = 0;
    for (int i = 0; i < size; i++)
        if (i % 2 == rank % 2 && i > rank) members++;
    CHECK(sr == members); /* higher world ranks come first */
    ring_check(s);
    MPI_Group gw, gs;
    MPI_Comm_group(MPI_COMM_WORLD, &gw);
    MPI_Comm_group(s, &gs);
    int t = sr, tw = -5;
    MPI_Group_translate_ranks(gs, 1, &t, gw, &tw);
    CHECK(tw == rank);
    MPI_Comm_compare(MPI_COMM_WORLD, s, &res);
    CHECK(res == (size == 1 ? MPI_CONGRUENT : MPI_UNEQUAL));
    MPI_Comm sn;
    MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? MPI_UNDEFINED : 1, 0, &sn);
    CHECK((rank == 0) == (sn == MPI_COMM_NULL));
    if (sn != MPI_COMM_NULL) {
        ring_check(sn);
        MPI_Comm_free(&sn);
    }

    /* groups */
    int gsz, gr;
    MPI_Group_size(gw, &gsz);
    MPI_Group_rank(gw, &gr);
    CHECK(gsz == size && gr == rank);
    int evens[8], ne = 0;
    for (int i = 0; i < size; i += 2) evens[ne++] = i;
    MPI_Group ge, go, gu, gi, gd, gr2;
    MPI_Group_incl(gw, ne, evens, &ge);
    MPI_Group_excl(gw, ne, evens, &go);
    MPI_Group_union(go, ge, &gu);
    MPI_Group_intersection(gw, ge, &gi);
    MPI_Group_difference(gw, ge, &gd);
    MPI_Group_compare(ge, gi, &res);
    CHECK(res == MPI_IDENT);
    MPI_Group_compare(gd, go, &res);
    CHECK(res == MPI_IDENT);
    MPI_Group_compare(gu, gw, &res);
    CHECK(res == (size <= 2 && size > 1 ? MPI_SIMILAR : (size == 1 ? MPI_IDENT : MPI_SIMILAR)));
    int ranges[1][3] = {{0, size - 1, 2}};
    MPI_Group_range_incl(gw, 1, ranges, &gr2);
    MPI_Group_compare(gr2, ge, &res);
    CHECK(res == MPI_IDENT);
    MPI_Group gx;
    MPI_Group_range_excl(gw, 1, ranges, &gx);
    MPI_Group_compare(gx, go, &res);
    CHECK(res == MPI_IDENT || (size == 1));
    MPI_Group_rank(ge, &gr);
    CHECK(gr == (rank % 2 == 0 ? rank / 2 : MPI_UNDEFINED));

    /* Comm_create (collective over WORLD) and Comm_create_group (over the group only) */
    MPI_Comm ce;
    MPI_Comm_create(MPI_COMM_WORLD, ge, &ce);
    CHECK((rank % 2 == 0) == (ce != MPI_COMM_NULL));
    if (ce != MPI_COMM_NULL) {
        ring_check(ce);
        MPI_Comm_free(&ce);
    }
    if (rank % 2 == 1) {
        MPI_Comm cg;
        MPI_Comm_create_group(MPI_COMM_WORLD, go, 7, &cg);
        ring_check(cg);
        int n;
        MPI_Comm_size(cg, &n);
        CHECK(n == size / 2);
        MPI_Comm_free(&cg);
    }
    MPI_Group_free(&ge); MPI_Group_free(&go); MPI_Group_free(&gu); MPI_Group_free(&gi);
    MPI_Group_free(&gd); MPI_Group_free(&gr2); MPI_Group_free(&gx); MPI_Group_free(&gs);
    CHECK(gs == MPI_GROUP_NULL);

    /* split_type shared: one host here => everyone */
    MPI_Comm sh;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &sh);
    int shs;
    MPI_Comm_size(sh, &shs);
    CHECK(shs == size);
    ring_check(sh);
    /* many communicators: create and free repeatedly */
    for (int i = 0; i < 50; i++) {
        MPI_Comm a, b;
        MPI_Comm_dup(sh, &a);
        MPI_Comm_split(a, rank % 3, rank, &b);
        ring_check(b);
        MPI_Comm_free(&a);
        MPI_Comm_free(&b);
    }
    MPI_Comm_free(&sh);
    MPI_Comm_free(&s);
    MPI_Group_free(&gw);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) printf("PASS comm_group\n");
    MPI_Finalize();
    return 0;
}
