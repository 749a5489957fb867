# Collectives microbenchmark of dist/ (included from bench/CMakeLists.txt); needs Open MPI, run under mpiexec.
if(TARGET kestrel_dist_mpi)
  add_executable(comm_bench ${CMAKE_CURRENT_LIST_DIR}/comm_bench.cpp)
  target_link_libraries(comm_bench PRIVATE kestrel_dist_mpi)
endif()
