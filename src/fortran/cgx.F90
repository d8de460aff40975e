! The Fortran 2008 module of cgx: `use cgx`. A thin layer over the C API
! (include/cgx/c.h) through ISO_C_BINDING; the library is cgx_fortran (CMake target
! cgx::fortran, find_package(cgx COMPONENTS c Fortran)), linked to cgx_c.
!
! Communicators: an mpi_f08 type(MPI_Comm) (where the MPI has mpi_f08 and the module was
! built with it: CGX_FORTRAN_HAVE_F08) or an integer handle of the old `mpi` module or
! mpif.h; both go through MPI_Comm_f2c on the C side.
!
! Every procedure takes an optional `ierr` (integer(c_int)): CGX_OK or a CGX_ERR_* code
! of the C API, with the message in cgx_last_error(). When `ierr` is absent and the call
! fails, the message is printed and the program stops (error stop), as MPI's default
! error handler would. No C++ exception reaches Fortran: every C function returns a code
! (include/cgx/c.h). There are no init procedures: the configuration types carry the C
! defaults as default initialization, timeout_ms CGX_DEFAULT_TIMEOUT, so a malformed
! CGX_TIMEOUT_MS is reported by the create (CGX_ERR_INVALID_ARGUMENT on every rank,
! naming the variable). Destroy makes the handle null (MPI_Comm_free's convention).
!
! Buffers are contiguous real(c_float) or real(c_double) arrays of any rank, passed
! whole: `call cgx_allreduce(plan, grad)`. For cgx_allreduce_start the array must be
! contiguous itself (no array section that needs a copy) and must not be touched until
! cgx_allreduce_wait.
module cgx
  use, intrinsic :: iso_c_binding
#ifdef CGX_FORTRAN_HAVE_F08
  use mpi_f08, only: MPI_Comm
#endif
  implicit none
  private

  ! cgx_errc
  integer(c_int), parameter, public :: CGX_OK = 0, CGX_ERR_INVALID_ARGUMENT = 1, CGX_ERR_MISMATCH = 2, &
       CGX_ERR_WORKSPACE = 3, CGX_ERR_COMMUNICATOR = 4, CGX_ERR_TRANSPORT = 5, CGX_ERR_CUDA = 6, &
       CGX_ERR_CORRUPT = 7, CGX_ERR_PEER_FAILED = 8, CGX_ERR_TIMEOUT = 9, CGX_ERR_NO_MEMORY = 10, &
       CGX_ERR_INTERNAL = 11
  ! cgx_datatype, cgx_rounding, cgx_schedule, cgx_checking
  integer(c_int), parameter, public :: CGX_FLOAT = 0, CGX_DOUBLE = 1
  integer(c_int), parameter, public :: CGX_STOCHASTIC = 0, CGX_NEAREST = 1
  integer(c_int), parameter, public :: CGX_SRA = 0, CGX_RING = 1
  integer(c_int), parameter, public :: CGX_CHECK_AUTOMATIC = 0, CGX_CHECK_LOCAL = 1, CGX_CHECK_COLLECTIVE = 2
  integer(c_size_t), parameter, public :: CGX_BUCKET_DEFAULT = 1024_c_size_t, CGX_BUCKET_SMALL = 128_c_size_t
  ! CGX_AUTO_THRESHOLD is SIZE_MAX: -1 in Fortran's signed c_size_t.
  integer(c_size_t), parameter, public :: CGX_AUTO_THRESHOLD = -1_c_size_t
  ! CGX_STATIC_THRESHOLD (SIZE_MAX - 2) and CGX_ALWAYS_NATIVE (SIZE_MAX - 3), likewise.
  integer(c_size_t), parameter, public :: CGX_STATIC_THRESHOLD = -3_c_size_t, CGX_ALWAYS_NATIVE = -4_c_size_t
  integer(c_int64_t), parameter, public :: CGX_DEFAULT_TIMEOUT = -1_c_int64_t
  ! CGX_INIT_FAILED is INT64_MIN (written so, as -huge - 1, to stay a constant expression).
  integer(c_int64_t), parameter, public :: CGX_INIT_FAILED = -huge(0_c_int64_t) - 1_c_int64_t

  !> cgx_options of c.h.
  type, bind(c), public :: cgx_options
    integer(c_int) :: check = CGX_CHECK_AUTOMATIC
    integer(c_int64_t) :: seed = int(z'63677821', c_int64_t)
    integer(c_int) :: threads = 1
    integer(c_size_t) :: native_below_bytes = CGX_AUTO_THRESHOLD
    integer(c_int64_t) :: timeout_ms = CGX_DEFAULT_TIMEOUT
    integer(c_int) :: verify = 0
  end type

  !> cgx_allreduce_config of c.h, with its defaults (cgx_allreduce_config_init).
  type, bind(c), public :: cgx_allreduce_config
    integer(c_int) :: type = CGX_FLOAT
    integer(c_int) :: bits = 4
    integer(c_size_t) :: bucket = CGX_BUCKET_DEFAULT
    integer(c_int) :: rounding = CGX_STOCHASTIC
    integer(c_int) :: schedule = CGX_SRA
    integer(c_size_t) :: max_count = 0
    type(cgx_options) :: options
  end type

  !> cgx_error_bounded_config of c.h, with its defaults.
  type, bind(c), public :: cgx_error_bounded_config
    integer(c_int) :: type = CGX_DOUBLE
    integer(c_int) :: schedule = CGX_SRA
    integer(c_size_t) :: max_count = 0
    type(cgx_options) :: options
  end type

  !> cgx_stats of c.h.
  type, bind(c), public :: cgx_stats
    integer(c_size_t) :: count = 0
    integer(c_int) :: native = 0
    integer(c_int32_t) :: calls = 0
    real(c_double) :: seconds = 0
    integer(c_size_t) :: raw_bytes = 0
    integer(c_size_t) :: compressed_bytes = 0
    integer(c_size_t) :: schedule_raw_bytes = 0
    real(c_double) :: bound = 0
    real(c_double) :: step_bound = 0
  end type

  !> A compressed allreduce plan (cgx_allreduce_plan*).
  type, public :: cgx_allreduce_plan
    type(c_ptr) :: p = c_null_ptr
  end type
  !> An error-bounded allreduce plan (cgx_error_bounded_plan*).
  type, public :: cgx_error_bounded_plan
    type(c_ptr) :: p = c_null_ptr
  end type

  public :: cgx_allreduce_create, cgx_allreduce, cgx_allreduce_start, cgx_allreduce_wait, cgx_allreduce_get_stats, &
       cgx_allreduce_destroy, cgx_error_bounded_create, cgx_error_bounded_allreduce, cgx_error_bounded_get_stats, &
       cgx_error_bounded_destroy, cgx_last_error, cgx_errc_name, cgx_version

  !> Collective: a plan over a communicator (type(MPI_Comm) or an integer handle).
  interface cgx_allreduce_create
    module procedure allreduce_create_int
#ifdef CGX_FORTRAN_HAVE_F08
    module procedure allreduce_create_f08
#endif
  end interface
  interface cgx_error_bounded_create
    module procedure error_bounded_create_int
#ifdef CGX_FORTRAN_HAVE_F08
    module procedure error_bounded_create_f08
#endif
  end interface
  !> Collective: sums the array over the ranks, in place.
  interface cgx_allreduce
    module procedure allreduce_f32, allreduce_f64
  end interface
  !> Collective: starts that sum; cgx_allreduce_wait completes it.
  interface cgx_allreduce_start
    module procedure start_f32, start_f64
  end interface
  !> Collective: sums the array so that every element is within `bound` of the exact sum.
  interface cgx_error_bounded_allreduce
    module procedure eb_allreduce_f32, eb_allreduce_f64
  end interface

  ! The C functions of c.h, one explicit interface each. (Declared instead as
  ! procedure(<abstract interface>), bind(c, name=...), cgx_allreduce received a wrong
  ! `type` argument from a float array under gfortran 12; not investigated further.)
  interface
    function c_allreduce(plan, buf, count, type) bind(c, name="cgx_allreduce") result(rc)
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: plan, buf
      integer(c_size_t), value :: count
      integer(c_int), value :: type
      integer(c_int) :: rc
    end function
    function c_allreduce_start(plan, buf, count, type) bind(c, name="cgx_allreduce_start") result(rc)
      import :: c_int, c_ptr, c_size_t
      type(c_ptr), value :: plan, buf
      integer(c_size_t), value :: count
      integer(c_int), value :: type
      integer(c_int) :: rc
    end function
    function c_allreduce_wait(plan) bind(c, name="cgx_allreduce_wait") result(rc)
      import :: c_int, c_ptr
      type(c_ptr), value :: plan
      integer(c_int) :: rc
    end function
    ! cgx_*_free(&plan): frees the plan and sets the handle to NULL.
    function c_allreduce_free(plan) bind(c, name="cgx_allreduce_free") result(rc)
      import :: c_int, c_ptr
      type(c_ptr), intent(inout) :: plan
      integer(c_int) :: rc
    end function
    function c_error_bounded_free(plan) bind(c, name="cgx_error_bounded_free") result(rc)
      import :: c_int, c_ptr
      type(c_ptr), intent(inout) :: plan
      integer(c_int) :: rc
    end function
    function c_allreduce_stats(plan, stats) bind(c, name="cgx_allreduce_stats") result(rc)
      import :: c_int, c_ptr, cgx_stats
      type(c_ptr), value :: plan
      type(cgx_stats), intent(out) :: stats
      integer(c_int) :: rc
    end function
    function c_error_bounded_stats(plan, stats) bind(c, name="cgx_error_bounded_stats") result(rc)
      import :: c_int, c_ptr, cgx_stats
      type(c_ptr), value :: plan
      type(cgx_stats), intent(out) :: stats
      integer(c_int) :: rc
    end function
    function c_last_error() bind(c, name="cgx_last_error") result(s)
      import :: c_ptr
      type(c_ptr) :: s
    end function
    function c_version() bind(c, name="cgx_version") result(s)
      import :: c_ptr
      type(c_ptr) :: s
    end function
  end interface

  interface
    function c_allreduce_create_f(comm, config, plan) bind(c, name="cgx_allreduce_create_f") result(rc)
      import :: c_int, c_ptr, cgx_allreduce_config
      integer(c_int), value :: comm
      type(cgx_allreduce_config), intent(in) :: config
      type(c_ptr), intent(out) :: plan
      integer(c_int) :: rc
    end function
    function c_error_bounded_create_f(comm, config, plan) bind(c, name="cgx_error_bounded_create_f") result(rc)
      import :: c_int, c_ptr, cgx_error_bounded_config
      integer(c_int), value :: comm
      type(cgx_error_bounded_config), intent(in) :: config
      type(c_ptr), intent(out) :: plan
      integer(c_int) :: rc
    end function
    function c_error_bounded_allreduce(plan, buf, count, type, bound) bind(c, name="cgx_error_bounded_allreduce") result(rc)
      import :: c_int, c_ptr, c_size_t, c_double
      type(c_ptr), value :: plan, buf
      integer(c_size_t), value :: count
      integer(c_int), value :: type
      real(c_double), value :: bound
      integer(c_int) :: rc
    end function
    function c_errc_name(code) bind(c, name="cgx_errc_name") result(s)
      import :: c_ptr, c_int
      integer(c_int), value :: code
      type(c_ptr) :: s
    end function
    function c_strlen(s) bind(c, name="strlen") result(n)
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
      integer(c_size_t) :: n
    end function
  end interface

contains

  ! A C string as a Fortran one.
  function from_c(s) result(f)
    type(c_ptr), intent(in) :: s
    character(len=:), allocatable :: f
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    if (.not. c_associated(s)) then
      f = ''
      return
    end if
    n = int(c_strlen(s))
    call c_f_pointer(s, chars, [n])
    allocate(character(len=n) :: f)
    do i = 1, n
      f(i:i) = chars(i)
    end do
  end function

  !> The message of this thread's last failed call ('' after a success).
  function cgx_last_error() result(msg)
    character(len=:), allocatable :: msg
    msg = from_c(c_last_error())
  end function

  !> The name of a code ('CGX_ERR_MISMATCH', ...).
  function cgx_errc_name(code) result(name)
    integer(c_int), intent(in) :: code
    character(len=:), allocatable :: name
    name = from_c(c_errc_name(code))
  end function

  !> The library's version, 'major.minor.patch'.
  function cgx_version() result(v)
    character(len=:), allocatable :: v
    v = from_c(c_version())
  end function

  ! Gives rc to ierr, or stops with the message when ierr is absent and rc is an error.
  subroutine finish(rc, ierr)
    integer(c_int), intent(in) :: rc
    integer(c_int), intent(out), optional :: ierr
    if (present(ierr)) then
      ierr = rc
    else if (rc /= CGX_OK) then
      write (*, '(a)') cgx_last_error()
      error stop 'cgx: a call failed and no ierr argument was given'
    end if
  end subroutine

  subroutine allreduce_create_int(plan, comm, config, ierr)
    type(cgx_allreduce_plan), intent(out) :: plan
    integer, intent(in) :: comm
    type(cgx_allreduce_config), intent(in) :: config
    integer(c_int), intent(out), optional :: ierr
    call finish(c_allreduce_create_f(int(comm, c_int), config, plan%p), ierr)
  end subroutine

  subroutine error_bounded_create_int(plan, comm, config, ierr)
    type(cgx_error_bounded_plan), intent(out) :: plan
    integer, intent(in) :: comm
    type(cgx_error_bounded_config), intent(in) :: config
    integer(c_int), intent(out), optional :: ierr
    call finish(c_error_bounded_create_f(int(comm, c_int), config, plan%p), ierr)
  end subroutine

#ifdef CGX_FORTRAN_HAVE_F08
  subroutine allreduce_create_f08(plan, comm, config, ierr)
    type(cgx_allreduce_plan), intent(out) :: plan
    type(MPI_Comm), intent(in) :: comm
    type(cgx_allreduce_config), intent(in) :: config
    integer(c_int), intent(out), optional :: ierr
    call finish(c_allreduce_create_f(int(comm%MPI_VAL, c_int), config, plan%p), ierr)
  end subroutine

  subroutine error_bounded_create_f08(plan, comm, config, ierr)
    type(cgx_error_bounded_plan), intent(out) :: plan
    type(MPI_Comm), intent(in) :: comm
    type(cgx_error_bounded_config), intent(in) :: config
    integer(c_int), intent(out), optional :: ierr
    call finish(c_error_bounded_create_f(int(comm%MPI_VAL, c_int), config, plan%p), ierr)
  end subroutine
#endif

  ! The specifics of the generic interfaces for each real kind: cgx_kind.inc, once per kind.
#define CGX_REAL real(c_float)
#define CGX_TYPE CGX_FLOAT
#define allreduce_k allreduce_f32
#define start_k start_f32
#define eb_allreduce_k eb_allreduce_f32
#include "cgx_kind.inc"
#undef CGX_REAL
#undef CGX_TYPE
#undef allreduce_k
#undef start_k
#undef eb_allreduce_k
#define CGX_REAL real(c_double)
#define CGX_TYPE CGX_DOUBLE
#define allreduce_k allreduce_f64
#define start_k start_f64
#define eb_allreduce_k eb_allreduce_f64
#include "cgx_kind.inc"

  !> Completes the sum begun by cgx_allreduce_start (CGX_OK when none is in flight).
  subroutine cgx_allreduce_wait(plan, ierr)
    type(cgx_allreduce_plan), intent(in) :: plan
    integer(c_int), intent(out), optional :: ierr
    call finish(c_allreduce_wait(plan%p), ierr)
  end subroutine

  !> What the plan's last successful call did, on this rank.
  subroutine cgx_allreduce_get_stats(plan, stats, ierr)
    type(cgx_allreduce_plan), intent(in) :: plan
    type(cgx_stats), intent(out) :: stats
    integer(c_int), intent(out), optional :: ierr
    call finish(c_allreduce_stats(plan%p, stats), ierr)
  end subroutine

  !> Frees the plan (waits for a reduction in flight first) and makes the handle null, as
  !> MPI_Comm_free does: a later call with it returns CGX_ERR_INVALID_ARGUMENT, a second
  !> destroy does nothing.
  subroutine cgx_allreduce_destroy(plan, ierr)
    type(cgx_allreduce_plan), intent(inout) :: plan
    integer(c_int), intent(out), optional :: ierr
    call finish(c_allreduce_free(plan%p), ierr)
  end subroutine

  !> What the plan's last successful call did, on this rank.
  subroutine cgx_error_bounded_get_stats(plan, stats, ierr)
    type(cgx_error_bounded_plan), intent(in) :: plan
    type(cgx_stats), intent(out) :: stats
    integer(c_int), intent(out), optional :: ierr
    call finish(c_error_bounded_stats(plan%p, stats), ierr)
  end subroutine

  !> Frees the plan and makes the handle null (as cgx_allreduce_destroy).
  subroutine cgx_error_bounded_destroy(plan, ierr)
    type(cgx_error_bounded_plan), intent(inout) :: plan
    integer(c_int), intent(out), optional :: ierr
    call finish(c_error_bounded_free(plan%p), ierr)
  end subroutine

end module cgx
