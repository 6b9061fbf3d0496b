# cq_folder_library(name deps...): one static library per source folder,
# built from the folder's .c files (main.c excluded). The folder's public
# headers are in its include/coderq/; include/coderq/ at the top still
# holds the headers of the folders not yet moved. A folder with no sources
# yet gives an interface library carrying only its dependencies.
function(cq_folder_library name)
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.c)
  list(REMOVE_ITEM srcs ${CMAKE_CURRENT_SOURCE_DIR}/main.c)
  set(incs)
  foreach(dir ${CMAKE_CURRENT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/include)
    if(IS_DIRECTORY ${dir})
      list(APPEND incs ${dir})
    endif()
  endforeach()
  if(srcs)
    add_library(${name} STATIC ${srcs})
    target_include_directories(${name} PUBLIC ${incs})
    target_link_libraries(${name} PUBLIC ${ARGN})
    cq_target_warnings(${name})
  else()
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${incs})
    target_link_libraries(${name} INTERFACE ${ARGN})
  endif()
endfunction()
