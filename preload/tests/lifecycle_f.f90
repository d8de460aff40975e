! lifecycle_c.c's checks from Fortran (`use mpi`): under Open MPI the Fortran bindings call
! PMPI_Comm_disconnect, PMPI_Comm_idup, ... themselves, so libcgx_mpi sees a
! communicator's end and its duplicates only through the attribute it hangs on the
! communicator. Pairs split from the world get hints (cgx_bits 4, cgx_min_bytes 64k) and
! an opted-in sum, then MPI_COMM_DISCONNECT; a split into other groups (which may reuse
! the handle) must sum exactly over its own group (no hints carried over); MPI_COMM_IDUP
! of a hinted duplicate of the world must be opted in (within max-min's bound, not exact).
! Rank 0 prints "PASS lifecycle_f" or "FAIL ...".
program lifecycle_f
  use mpi
  implicit none
  integer, parameter :: n = 16384
  double precision :: buf(n)
  integer :: ierr, rank, nranks, a, b, c, d, req, info, bad, all_bad, round

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  bad = 0
  call MPI_Info_create(info, ierr)
  call MPI_Info_set(info, 'cgx_bits', '4', ierr)
  call MPI_Info_set(info, 'cgx_min_bytes', '64k', ierr)

  do round = 1, 2
    call MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, a, ierr)
    call MPI_Comm_set_info(a, info, ierr)
    call check(a, -1, 'pairs with hints')
    call MPI_Comm_disconnect(a, ierr)
    if (nranks >= 4) then
      call MPI_Comm_split(MPI_COMM_WORLD, mod(rank, 2), rank, b, ierr)
    else
      call MPI_Comm_split(MPI_COMM_WORLD, rank, rank, b, ierr)
    end if
    call check(b, 0, 'new split after MPI_COMM_DISCONNECT, no hints')
    call MPI_Comm_free(b, ierr)
  end do

  call MPI_Comm_dup(MPI_COMM_WORLD, c, ierr)
  call MPI_Comm_set_info(c, info, ierr)
  call MPI_Comm_idup(c, d, req, ierr)
  call MPI_Wait(req, MPI_STATUS_IGNORE, ierr)
  if (nranks > 1) call check(d, 1, 'MPI_COMM_IDUP of a hinted duplicate')
  call MPI_Comm_free(d, ierr)
  call MPI_Comm_free(c, ierr)
  call MPI_Info_free(info, ierr)

  call MPI_Allreduce(bad, all_bad, 1, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD, ierr)
  if (rank == 0) then
    if (all_bad == 0) then
      print '(a)', 'PASS lifecycle_f'
    else
      print '(a)', 'FAIL: a result above was not as it should be'
    end if
  end if
  call MPI_Finalize(ierr)

contains

  double precision function value(r, i)
    integer, intent(in) :: r, i
    value = r + mod(i, 7) / 10.0d0
  end function

  ! compressed: 1 within 4-bit max-min's bound and not exact, 0 exact, -1 either.
  subroutine check(comm, compressed, what)
    integer, intent(in) :: comm, compressed
    character(*), intent(in) :: what
    integer :: p, k, i, inexact, wrong, rc
    integer, allocatable :: members(:)
    double precision :: want, err, bound
    logical :: ok
    call MPI_Comm_size(comm, p, rc)
    allocate(members(p))
    call MPI_Allgather(rank, 1, MPI_INTEGER, members, 1, MPI_INTEGER, comm, rc)
    do i = 1, n
      buf(i) = value(rank, i)
    end do
    call MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE_PRECISION, MPI_SUM, comm, rc)
    bound = 2.0d0 * p * 0.6d0 / 15.0d0 * 1.01d0
    inexact = 0
    wrong = 0
    do i = 1, n
      want = 0
      do k = 1, p
        want = want + value(members(k), i)
      end do
      err = abs(buf(i) - want)
      if (err > 1d-9) inexact = inexact + 1
      if (err > bound) wrong = wrong + 1
    end do
    ok = rc == MPI_SUCCESS .and. wrong == 0
    if (compressed == 1) ok = ok .and. inexact > 0
    if (compressed == 0) ok = ok .and. inexact == 0
    if (.not. ok) bad = 1
    if (ok) then
      print '(a,i0,a,a,a,i0,a,i0,a,i0,a)', 'rank ', rank, ': ', what, ' (', p, ' ranks): ', inexact, &
          ' values inexact, ', wrong, ' beyond the bound'
    else
      print '(a,i0,a,a,a,i0,a,i0,a,i0,a)', 'rank ', rank, ': ', what, ' (', p, ' ranks): ', inexact, &
          ' values inexact, ', wrong, ' beyond the bound -- UNEXPECTED'
    end if
    deallocate(members)
  end subroutine

end program
