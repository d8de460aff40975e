! An ordinary Fortran MPI program (`use mpi`) that knows nothing of the library it may
! run under: MPI_ALLREDUCE of REAL, DOUBLE PRECISION and INTEGER, with MPI_SUM and
! MPI_MAX, in place and not, scalars, small and large counts, on MPI_COMM_WORLD and on a
! duplicate.
!
!   allreduce_f OUTDIR
!
! Rank 0 writes each result to OUTDIR/<id>.bin and prints, as allreduce_c does:
!   result <id> <type> <count> <op> <comm> <inplace> <input_range_sum> <output_range> <ranks_agree>
program allreduce_f
  use mpi
  implicit none
  integer :: ierr, rank, nranks, dup
  character(len=1024) :: outdir

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  call get_command_argument(1, outdir)

  call reduce_fp('f_r4_sum', 'f32', 1000000, MPI_SUM, 'sum', MPI_COMM_WORLD, 'world', .false., .false.)
  call reduce_fp('f_r4_sum_inplace_grad', 'f32', 1048576, MPI_SUM, 'sum', MPI_COMM_WORLD, 'world', .true., .true.)
  call reduce_fp('f_r4_max', 'f32', 500000, MPI_MAX, 'max', MPI_COMM_WORLD, 'world', .false., .false.)
  call reduce_fp('f_r4_small', 'f32', 1000, MPI_SUM, 'sum', MPI_COMM_WORLD, 'world', .true., .false.)
  call reduce_fp('f_r8_sum_inplace', 'f64', 300000, MPI_SUM, 'sum', MPI_COMM_WORLD, 'world', .true., .false.)
  call reduce_fp('f_r8_sum_large', 'f64', 1500000, MPI_SUM, 'sum', MPI_COMM_WORLD, 'world', .false., .false.)
  call reduce_fp('f_r8_scalar', 'f64', 1, MPI_SUM, 'sum', MPI_COMM_WORLD, 'world', .true., .false.)
  call reduce_int('f_int_sum', 500000, MPI_COMM_WORLD, 'world')
  call MPI_Comm_dup(MPI_COMM_WORLD, dup, ierr)
  call reduce_fp('f_dup_r8_sum', 'f64', 400000, MPI_SUM, 'sum', dup, 'dup', .false., .false.)
  call MPI_Comm_free(dup, ierr)
  if (rank == 0) print '(a,i0,a)', 'done ', nranks, ' ranks'
  call MPI_Finalize(ierr)

contains

  real(8) function smooth(r, i, n)
    integer, intent(in) :: r, i, n
    real(8) :: x
    x = dble(i) / dble(n)
    smooth = sin(6.283185307179586d0 * x + 0.3d0 * r) + 0.5d0 * cos(12.566370614359172d0 * x * (r + 1))
  end function

  real(8) function grad(r, i)
    integer, intent(in) :: r, i
    grad = 0.01d0 * (modulo(dble(i) * 0.6180339887498949d0 + dble(r) * 0.41421356237d0, 1.0d0) - 0.5d0) &
           * (1.0d0 + dble(mod(i, 7)))
  end function

  subroutine report(id, tname, n, opname, cname, inplace, my_range, out_range, bytes, comm)
    character(len=*), intent(in) :: id, tname, opname, cname
    integer, intent(in) :: n, comm
    logical, intent(in) :: inplace
    real(8), intent(in) :: my_range, out_range
    integer(8), intent(in) :: bytes(:)
    real(8) :: range_sum
    integer(8) :: h, hmax, hmin
    integer :: i, crank
    ! Two checksums (sum and an alternating weighted sum of the bytes) compared across ranks.
    h = 0
    do i = 1, size(bytes)
      h = ieor(h * 31_8, bytes(i))
    end do
    call MPI_Allreduce(h, hmax, 1, MPI_INTEGER8, MPI_MAX, comm, ierr)
    call MPI_Allreduce(h, hmin, 1, MPI_INTEGER8, MPI_MIN, comm, ierr)
    call MPI_Allreduce(my_range, range_sum, 1, MPI_DOUBLE_PRECISION, MPI_SUM, comm, ierr)
    call MPI_Comm_rank(comm, crank, ierr)
    if (rank == 0) then
      print '(a,1x,a,1x,a,1x,i0,1x,a,1x,a,1x,i0,1x,es25.17,1x,es25.17,1x,i0)', 'result', id, tname, n, opname, cname, &
            merge(1, 0, inplace), range_sum, out_range, merge(1, 0, hmax == hmin)
    end if
  end subroutine

  subroutine write_bin(id, data, nbytes)
    character(len=*), intent(in) :: id
    integer, intent(in) :: nbytes
    integer(1), intent(in) :: data(nbytes)
    integer :: u
    if (rank /= 0) return
    open(newunit=u, file=trim(outdir)//'/'//id//'.bin', access='stream', form='unformatted', status='replace')
    write(u) data
    close(u)
  end subroutine

  ! One reduction of REAL (tname 'f32') or DOUBLE PRECISION ('f64') values: the buffers
  ! are bytes, the values are made in double precision and stored in the type reduced.
  subroutine reduce_fp(id, tname, n, op, opname, comm, cname, inplace, use_grad)
    character(len=*), intent(in) :: id, tname, opname, cname
    integer, intent(in) :: n, op, comm
    logical, intent(in) :: inplace, use_grad
    real(8), allocatable :: v(:), w(:)
    integer(1), allocatable :: a(:), b(:)
    integer :: i, crank, bytes, dtype
    call MPI_Comm_rank(comm, crank, ierr)
    allocate(v(n))
    do i = 1, n
      if (use_grad) then
        v(i) = grad(crank, i - 1)
      else
        v(i) = smooth(crank, i - 1, n)
      end if
    end do
    if (tname == 'f32') then
      bytes = 4
      dtype = MPI_REAL
      a = transfer(real(v, 4), [0_1])
      v = real(real(v, 4), 8)
    else
      bytes = 8
      dtype = MPI_DOUBLE_PRECISION
      a = transfer(v, [0_1])
    end if
    if (inplace) then
      b = a
      call MPI_Allreduce(MPI_IN_PLACE, b, n, dtype, op, comm, ierr)
    else
      allocate(b(bytes * n))
      call MPI_Allreduce(a, b, n, dtype, op, comm, ierr)
    end if
    if (bytes == 4) then
      w = real(transfer(b, [0.0_4], n), 8)
    else
      w = transfer(b, [0.0_8], n)
    end if
    call write_bin(id, b, bytes * n)
    call report(id, tname, n, opname, cname, inplace, maxval(v) - minval(v), maxval(w) - minval(w), &
                int(transfer(b, [0_4]), 8), comm)
    deallocate(v, w, a, b)
  end subroutine

  subroutine reduce_int(id, n, comm, cname)
    character(len=*), intent(in) :: id, cname
    integer, intent(in) :: n, comm
    integer, allocatable :: a(:), b(:)
    integer :: i, crank
    call MPI_Comm_rank(comm, crank, ierr)
    allocate(a(n), b(n))
    do i = 1, n
      a(i) = nint(1000 * smooth(crank, i - 1, n))
    end do
    call MPI_Allreduce(a, b, n, MPI_INTEGER, MPI_SUM, comm, ierr)
    call write_bin(id, transfer(b, [0_1]), 4 * n)
    call report(id, 'int', n, 'sum', cname, .false., dble(maxval(a) - minval(a)), dble(maxval(b) - minval(b)), &
                int(b, 8), comm)
    deallocate(a, b)
  end subroutine

end program
