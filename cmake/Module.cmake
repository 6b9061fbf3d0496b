# cq_folder_library(name deps...): one static library per source folder,
# built from the folder's .c files (main.c excluded), whose public headers
# are the folder's include/coderq/*.h.
function(cq_folder_library name)
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.c)
  list(REMOVE_ITEM srcs ${CMAKE_CURRENT_SOURCE_DIR}/main.c)
  add_library(${name} STATIC ${srcs})
  target_include_directories(${name} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include)
  target_link_libraries(${name} PUBLIC ${ARGN})
  cq_target_warnings(${name})
endfunction()
