! An ensemble of 2-D heat simulations whose fields are averaged through cgx's
! error-bounded allreduce, from Fortran (`use cgx`): the Fortran version of
! examples/heat_ensemble.cpp. Every rank runs one ensemble member: an n x n grid of
! doubles, heated by four hot spots of its own, cooled at the border, integrated with
! the explicit 5-point stencil. Every `every` steps the members' fields are summed over
! the ensemble (cgx_error_bounded_allreduce, SRA) and each member relaxes towards the
! ensemble mean, so the reduced field feeds back into the simulation.
!
! For each bound (relative to the range of the ensemble sum: 1e-2 .. 1e-6) the run
! starts from the same initial state and compares every reduction, element by element,
! with an uncompressed MPI_Allreduce of the same fields. It prints the bound, the worst
! error seen on any element of any rank, and the bytes on the wire against the bytes
! of the same schedule uncompressed. Last, the final fields are summed once more with a
! 4-bit max-min allreduce (start/wait, ring, over an integer communicator handle) and
! checked against the max-min bound. The exit status is 1 if any bound was violated.
!
!   mpirun -np 4 ./cgx_heat_ensemble_f [n [steps [every]]]
program heat_ensemble
  use, intrinsic :: iso_c_binding, only: c_int, c_double, c_size_t
  use mpi_f08
  use cgx
  implicit none

  integer :: n = 512, steps = 200, every = 20
  integer :: rank, p, provided, s, k, ierr
  integer(c_int) :: rc
  real(c_double), allocatable :: u(:, :), nxt(:, :), hot(:, :), total(:, :), exact(:, :)
  real(c_double) :: range, bound, worst, w, rels(5)
  integer(8) :: bytes(2), sums(2)
  logical :: all_held, held
  type(cgx_error_bounded_config) :: cfg
  type(cgx_error_bounded_plan) :: plan
  type(cgx_stats) :: st

  call MPI_Init_thread(MPI_THREAD_SERIALIZED, provided)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, p)
  call read_arguments()
  allocate(u(n, n), nxt(n, n), hot(n, n), total(n, n), exact(n, n))

  ! Always compress: on one node the default threshold would hand every call to MPI.
  cfg%type = CGX_DOUBLE
  cfg%schedule = CGX_SRA
  cfg%max_count = int(n, c_size_t) * n
  cfg%options%native_below_bytes = 0
  call cgx_error_bounded_create(plan, MPI_COMM_WORLD, cfg, rc)
  if (rc /= CGX_OK) call fail('cgx_error_bounded_create', rc)

  ! The range of the ensemble sum at the first reduction sets the absolute bounds.
  call init_member()
  do s = 1, every
    call step()
  end do
  call MPI_Allreduce(u, total, n * n, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
  range = maxval(total) - minval(total)
  if (rank == 0) then
    write (*, '(a,i0,a,i0,a,i0,a,i0,a,a)') 'cgx heat_ensemble (Fortran): ', p, ' ranks, ', n, ' x ', n, &
         ' doubles each, ', steps, ' steps, error-bounded allreduce + SRA, cgx ', cgx_version()
    write (*, '(a,es11.4)') 'range of the ensemble sum: ', range
    write (*, '(a10,1x,a10,1x,a12,1x,a10,1x,a13,1x,a13)') 'bound/rng', 'bound', 'worst_err', 'worst/bnd', &
         'wire_bytes', 'raw_bytes'
  end if

  rels = [1d-2, 1d-3, 1d-4, 1d-5, 1d-6]
  all_held = .true.
  do k = 1, size(rels)
    bound = rels(k) * range
    call init_member()
    worst = 0
    bytes = 0
    do s = 1, steps
      call step()
      if (mod(s, every) /= 0) cycle
      call MPI_Allreduce(u, exact, n * n, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
      total = u
      call cgx_error_bounded_allreduce(plan, total, bound, rc)
      if (rc /= CGX_OK) call fail('cgx_error_bounded_allreduce', rc)
      call cgx_error_bounded_get_stats(plan, st)
      bytes = bytes + [int(st%compressed_bytes, 8), int(st%schedule_raw_bytes, 8)]
      worst = max(worst, maxval(abs(total - exact)))
      ! Relax towards the ensemble mean (the reduced field feeds back into the run).
      u = u + 0.1d0 * (total / p - u)
      call hold_spots()
    end do
    w = worst
    call MPI_Allreduce(w, worst, 1, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD)
    call MPI_Allreduce(bytes, sums, 2, MPI_INTEGER8, MPI_SUM, MPI_COMM_WORLD)
    held = worst <= bound
    all_held = all_held .and. held
    if (rank == 0) write (*, '(es10.0,1x,es10.3,1x,es12.3,1x,f10.3,1x,i13,1x,i13,a)') rels(k), bound, worst, &
         worst / bound, sums(1), sums(2), merge('                ', '  BOUND VIOLATED', held)
  end do
  call cgx_error_bounded_destroy(plan)

  call check_maxmin()

  if (rank == 0) then
    if (all_held) then
      write (*, '(a)') 'bound held at every bound (worst error <= bound on every element of every rank)'
    else
      write (*, '(a)') 'BOUND VIOLATED'
    end if
  end if
  call MPI_Finalize()
  if (.not. all_held) stop 1

contains

  subroutine read_arguments()
    character(len=32) :: arg
    integer :: v(3), i, nargs
    v = [n, steps, every]
    nargs = min(command_argument_count(), 3)
    do i = 1, nargs
      call get_command_argument(i, arg)
      read (arg, *) v(i)
    end do
    n = max(v(1), 24)
    steps = max(v(2), 1)
    every = max(v(3), 1)
  end subroutine

  ! This rank's member: a cold field and four hot spots of radius 6 (the same on every
  ! run of this rank: the generator is seeded from the rank).
  subroutine init_member()
    integer, allocatable :: seed(:)
    integer :: m, spot, ci, cj, i, j
    real(c_double) :: r(3)
    call random_seed(size=m)
    allocate(seed(m))
    seed = [(104729 * (rank + 1) + 7919 * i, i = 1, m)]
    call random_seed(put=seed)
    u = 0
    hot = -1
    do spot = 1, 4
      call random_number(r)
      ci = 8 + int(r(1) * (n - 16))
      cj = 8 + int(r(2) * (n - 16))
      do j = max(cj - 6, 1), min(cj + 6, n)
        do i = max(ci - 6, 1), min(ci + 6, n)
          if ((i - ci)**2 + (j - cj)**2 <= 36) hot(i, j) = 50 + 50 * r(3)
        end do
      end do
    end do
    call hold_spots()
  end subroutine

  subroutine hold_spots()
    where (hot >= 0) u = hot
  end subroutine

  ! One explicit step of u_t = laplace(u) (dt/dx^2 = 0.2); the border stays at 0.
  subroutine step()
    nxt = 0
    nxt(2:n-1, 2:n-1) = u(2:n-1, 2:n-1) + 0.2d0 * (u(1:n-2, 2:n-1) + u(3:n, 2:n-1) + u(2:n-1, 1:n-2) &
         + u(2:n-1, 3:n) - 4 * u(2:n-1, 2:n-1))
    call move_alloc_swap()
    call hold_spots()
  end subroutine

  subroutine move_alloc_swap()
    real(c_double), allocatable :: t(:, :)
    call move_alloc(u, t)
    call move_alloc(nxt, u)
    call move_alloc(t, nxt)
  end subroutine

  ! A 4-bit max-min allreduce of the final fields (ring, stochastic, start/wait, plan made
  ! from the integer handle of MPI_COMM_WORLD), checked against a bound that holds for any
  ! bucket: the ring re-quantizes the running sum at each of its p hops, each time within
  ! one unit, (range + 2 * error so far) / 15, where the range of any partial sum in a
  ! bucket is at most R, the sum of the ranks' whole-field ranges.
  subroutine check_maxmin()
    type(cgx_allreduce_config) :: mc
    type(cgx_allreduce_plan) :: mp
    real(c_double), allocatable, target, asynchronous :: g(:, :)
    real(c_double) :: rr, e, bnd, werr, all_werr
    integer :: hop
    mc%type = CGX_DOUBLE
    mc%bits = 4
    mc%schedule = CGX_RING
    mc%rounding = CGX_STOCHASTIC
    mc%max_count = int(n, c_size_t) * n
    mc%options%native_below_bytes = 0
    call cgx_allreduce_create(mp, MPI_COMM_WORLD%MPI_VAL, mc, rc)
    if (rc /= CGX_OK) call fail('cgx_allreduce_create', rc)
    allocate(g(n, n))
    g = u
    call MPI_Allreduce(u, exact, n * n, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
    call MPI_Allreduce(maxval(u) - minval(u), rr, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
    if (provided >= MPI_THREAD_SERIALIZED) then
      call cgx_allreduce_start(mp, g, rc)
      if (rc /= CGX_OK) call fail('cgx_allreduce_start', rc)
      call cgx_allreduce_wait(mp, rc)
    else
      call cgx_allreduce(mp, g, rc)
    end if
    if (rc /= CGX_OK) call fail('cgx_allreduce', rc)
    e = 0
    do hop = 1, p
      e = e + (rr + 2 * e) / 15
    end do
    bnd = e + 1d-6 * rr * p
    werr = maxval(abs(g - exact))
    call MPI_Allreduce(werr, all_werr, 1, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD)
    held = all_werr <= bnd
    all_held = all_held .and. held
    if (rank == 0) write (*, '(a,es10.3,a,es10.3,a)') 'max-min 4-bit ring (start/wait) of the final fields: worst error ', &
         all_werr, ', bound ', bnd, merge('                ', '  BOUND VIOLATED', held)
    call cgx_allreduce_destroy(mp)
  end subroutine

  subroutine fail(what, code)
    character(len=*), intent(in) :: what
    integer(c_int), intent(in) :: code
    write (*, '(a,a,a,a,a)') what, ' failed: ', cgx_errc_name(code), ': ', cgx_last_error()
    call MPI_Abort(MPI_COMM_WORLD, 2, ierr)
  end subroutine

end program heat_ensemble
