! An ordinary Fortran 2008 MPI program (`use mpi_f08`): two MPI_Allreduce calls of DOUBLE
! PRECISION with MPI_SUM, one in place, on MPI_COMM_WORLD. The buffers are constant on each
! rank, so any correct sum (and a compressed one: a constant bucket is reproduced exactly)
! is r(r+1)/2 everywhere. Rank 0 prints "f08 sums exact" or "f08 WRONG".
program allreduce_f08
  use mpi_f08
  implicit none
  integer, parameter :: n = 100000
  integer :: rank, nranks, bad
  real(8), allocatable :: a(:), b(:)
  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks)
  allocate(a(n), b(n))
  a = rank + 1
  call MPI_Allreduce(a, b, n, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
  call MPI_Allreduce(MPI_IN_PLACE, a, n, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
  bad = count(a /= nranks * (nranks + 1) / 2) + count(b /= nranks * (nranks + 1) / 2)
  call MPI_Allreduce(MPI_IN_PLACE, bad, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
  if (rank == 0) then
    if (bad == 0) then
      print '(a)', 'f08 sums exact'
    else
      print '(a,i0,a)', 'f08 WRONG: ', bad, ' values'
    end if
  end if
  call MPI_Finalize()
end program
