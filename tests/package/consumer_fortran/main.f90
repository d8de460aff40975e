! A user's Fortran program: a 4-bit compressed allreduce and an error-bounded one over
! MPI_COMM_WORLD (mpi_f08), checked against the exact sums.
program consumer
  use, intrinsic :: iso_c_binding, only: c_int, c_float, c_double
  use mpi_f08
  use cgx
  implicit none
  integer, parameter :: n = 3000
  integer :: rank, nranks, i, bad, any_bad
  integer(c_int) :: rc
  real(c_float) :: buf(n)
  real(c_double) :: eb(n), s, worst, ebworst, bound
  type(cgx_allreduce_config) :: c
  type(cgx_allreduce_plan) :: plan
  type(cgx_error_bounded_config) :: e
  type(cgx_error_bounded_plan) :: ebp

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks)
  bad = 0
  do i = 1, n
    buf(i) = real(rank + 1, c_float) * (0.5 + 0.5 * sin(0.01 * real(i, c_float)))
    eb(i) = (rank + 1) * cos(0.002d0 * i)
  end do
  c%bits = 4
  c%rounding = CGX_NEAREST
  c%max_count = n
  c%options%native_below_bytes = 0
  call cgx_allreduce_create(plan, MPI_COMM_WORLD, c, rc)
  if (rc /= CGX_OK) bad = 1
  call cgx_allreduce(plan, buf, rc)
  if (rc /= CGX_OK) bad = 1
  call cgx_allreduce_destroy(plan)
  s = 0.5d0 * nranks * (nranks + 1)
  bound = s / 15 + 1d-4
  worst = 0
  do i = 1, n
    worst = max(worst, abs(buf(i) - s * (0.5d0 + 0.5d0 * sin(0.01d0 * i))))
  end do
  if (.not. (worst <= bound)) bad = 1

  e%max_count = n
  e%options%native_below_bytes = 0
  call cgx_error_bounded_create(ebp, MPI_COMM_WORLD, e, rc)
  if (rc /= CGX_OK) bad = 1
  call cgx_error_bounded_allreduce(ebp, eb, 1d-5, rc)
  if (rc /= CGX_OK) then
    bad = 1
    print '(a)', cgx_last_error()
  end if
  call cgx_error_bounded_destroy(ebp)
  ebworst = 0
  do i = 1, n
    ebworst = max(ebworst, abs(eb(i) - s * cos(0.002d0 * i)))
  end do
  if (.not. (ebworst <= 1d-5 + 1d-12)) bad = 1

  call MPI_Allreduce(bad, any_bad, 1, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD)
  if (rank == 0 .or. bad /= 0) then
    if (any_bad == 0) then
      write (*, '(a,i0,a,a,a,es10.3,a,es10.3)') 'cgx Fortran consumer OK: ', nranks, ' ranks, cgx ', cgx_version(), &
           ', max-min error ', worst, ', error-bounded ', ebworst
    else
      write (*, '(a,i0,a,es10.3,a,es10.3)') 'cgx Fortran consumer FAILED: rank ', rank, ', max-min error ', worst, &
           ', error-bounded ', ebworst
    end if
  end if
  call MPI_Finalize()
  if (any_bad /= 0) stop 1
end program consumer
