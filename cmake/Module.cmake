# cq_folder_library(name deps...): one static library per source folder,
# built from the folder's .c files (main.c excluded). A folder with no
# sources yet gives an interface library carrying only its dependencies.
function(cq_folder_library name)
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.c)
  list(REMOVE_ITEM srcs ${CMAKE_CURRENT_SOURCE_DIR}/main.c)
  if(srcs)
    add_library(${name} STATIC ${srcs})
    target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/include)
    target_link_libraries(${name} PUBLIC ${ARGN})
    cq_target_warnings(${name})
  else()
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${PROJECT_SOURCE_DIR}/include)
    target_link_libraries(${name} INTERFACE ${ARGN})
  endif()
endfunction()
