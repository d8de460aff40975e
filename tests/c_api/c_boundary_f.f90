! The Fortran module's side of issue 47, item 4: with a malformed CGX_TIMEOUT_MS (set
! through C's setenv) a create returns CGX_ERR_INVALID_ARGUMENT naming the variable, on
! every rank, and nothing stops the program; a configuration with an explicit
! timeout_ms works; destroy makes the handle null, a call with it then returns a code and
! a second destroy does nothing. Rank 0 prints "c_boundary_f: ok", or each failed check.
program c_boundary_f
  use, intrinsic :: iso_c_binding
  use mpi_f08
  use cgx
  implicit none
  interface
    function setenv(name, value, overwrite) bind(c, name="setenv") result(rc)
      import :: c_char, c_int
      character(kind=c_char), intent(in) :: name(*), value(*)
      integer(c_int), value :: overwrite
      integer(c_int) :: rc
    end function
  end interface
  integer :: rank, nranks, bad, any_bad
  integer(c_int) :: rc
  real(c_float) :: buf(1000)
  real(c_double) :: eb(1000)
  type(cgx_allreduce_config) :: c
  type(cgx_allreduce_plan) :: plan
  type(cgx_error_bounded_config) :: e
  type(cgx_error_bounded_plan) :: ebp

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks)
  bad = 0
  rc = setenv("CGX_TIMEOUT_MS" // c_null_char, "5s" // c_null_char, 1_c_int)

  c%max_count = 1000
  c%options%native_below_bytes = 0
  call cgx_allreduce_create(plan, MPI_COMM_WORLD, c, rc)
  call expect(rc == CGX_ERR_INVALID_ARGUMENT, 'create with the default timeout refused')
  call expect(index(cgx_last_error(), "CGX_TIMEOUT_MS='5s'") > 0, 'the message names the variable and its value')
  call expect(index(cgx_last_error(), 'cgx: cgx:') == 0, 'the prefix once')
  call expect(.not. c_associated(plan%p), 'no plan')
  e%max_count = 1000
  e%options%native_below_bytes = 0
  call cgx_error_bounded_create(ebp, MPI_COMM_WORLD, e, rc)
  call expect(rc == CGX_ERR_INVALID_ARGUMENT, 'error-bounded create with the default timeout refused')

  c%options%timeout_ms = 60000
  call cgx_allreduce_create(plan, MPI_COMM_WORLD, c, rc)
  call expect(rc == CGX_OK, 'create with an explicit timeout')
  buf = real(rank + 1, c_float)
  call cgx_allreduce(plan, buf, rc)
  call expect(rc == CGX_OK .and. buf(1000) == 0.5 * nranks * (nranks + 1), 'the sum')
  call cgx_allreduce_destroy(plan, rc)
  call expect(rc == CGX_OK .and. .not. c_associated(plan%p), 'destroy makes the handle null')
  call cgx_allreduce(plan, buf, rc)
  call expect(rc == CGX_ERR_INVALID_ARGUMENT, 'a call with a destroyed plan returns a code')
  call cgx_allreduce_destroy(plan, rc)
  call expect(rc == CGX_OK, 'a second destroy does nothing')

  e%options%timeout_ms = 0
  call cgx_error_bounded_create(ebp, MPI_COMM_WORLD, e, rc)
  call expect(rc == CGX_OK, 'error-bounded create with an explicit timeout')
  eb = 0.5d0 * (rank + 1)
  call cgx_error_bounded_allreduce(ebp, eb, 1d-3, rc)
  call expect(rc == CGX_OK .and. abs(eb(7) - 0.25d0 * nranks * (nranks + 1)) <= 1d-3, 'the error-bounded sum')
  call cgx_error_bounded_destroy(ebp, rc)
  call expect(rc == CGX_OK .and. .not. c_associated(ebp%p), 'error-bounded destroy makes the handle null')
  call cgx_error_bounded_allreduce(ebp, eb, 1d-3, rc)
  call expect(rc == CGX_ERR_INVALID_ARGUMENT, 'a call with a destroyed error-bounded plan returns a code')

  call MPI_Allreduce(bad, any_bad, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
  if (rank == 0) then
    if (any_bad == 0) then
      print '(a,i0,a)', 'c_boundary_f: ok (', nranks, ' ranks)'
    else
      print '(a,i0,a)', 'c_boundary_f: ', any_bad, ' checks FAILED'
    end if
  end if
  call MPI_Finalize()
  if (any_bad /= 0) error stop 1

contains

  subroutine expect(ok, what)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    if (.not. ok) then
      bad = bad + 1
      print '(a,i0,a,a,a,a)', 'c_boundary_f: rank ', rank, ': FAILED ', what, ': ', cgx_last_error()
    end if
  end subroutine

end program
