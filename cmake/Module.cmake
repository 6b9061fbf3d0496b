# The rooms (cmake/rooms.txt): each source folder is one static library,
# whose public headers are include/coderq/<name>/*.h (<name>: the
# folder's last component), linked to the
# libraries of exactly the rooms the table lets it call, and privately:
# a room's sources see the headers of those rooms only, so including a
# header of any other room does not compile. scripts/rooms.sh checks the
# same table against the #include lines, with a clearer message.
file(STRINGS ${PROJECT_SOURCE_DIR}/cmake/rooms.txt _cq_rooms REGEX "^[a-z]")
set(CQ_ROOM_LIBRARIES)
foreach(_line IN LISTS _cq_rooms)
  string(REGEX REPLACE "[ \t]+" ";" _fields "${_line}")
  list(GET _fields 0 _folder)
  list(GET _fields 1 _lib)
  list(SUBLIST _fields 2 -1 _calls)
  list(REMOVE_ITEM _calls "-")
  string(MAKE_C_IDENTIFIER "${_folder}" _key)
  set(CQ_ROOM_LIB_${_key} ${_lib})
  set(CQ_ROOM_CALLS_${_key} ${_calls})
  list(APPEND CQ_ROOM_LIBRARIES ${_lib})
endforeach()

# cq_room([EXECUTABLE name] [PUBLIC_LIBS lib...] [LIBS lib...]): the current
# folder's library (named in cmake/rooms.txt), built from its .c files
# except main.c, which EXECUTABLE builds into the program \p name, a
# source of the same room. PUBLIC_LIBS: outside libraries its public
# headers include (callers get them too); LIBS: outside libraries only
# its sources use.
function(cq_room)
  cmake_parse_arguments(ARG "" "EXECUTABLE" "PUBLIC_LIBS;LIBS" ${ARGN})
  file(RELATIVE_PATH folder ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
  string(MAKE_C_IDENTIFIER "${folder}" key)
  if(NOT DEFINED CQ_ROOM_LIB_${key})
    message(FATAL_ERROR "${folder}/ is not a room of cmake/rooms.txt")
  endif()
  set(name ${CQ_ROOM_LIB_${key}})
  set(rooms)
  foreach(callee IN LISTS CQ_ROOM_CALLS_${key})
    string(MAKE_C_IDENTIFIER "${callee}" ckey)
    if(NOT DEFINED CQ_ROOM_LIB_${ckey})
      message(FATAL_ERROR "${folder}/ may call ${callee}/, not a room")
    endif()
    list(APPEND rooms ${CQ_ROOM_LIB_${ckey}})
  endforeach()
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.c)
  list(REMOVE_ITEM srcs ${CMAKE_CURRENT_SOURCE_DIR}/main.c)
  add_library(${name} STATIC ${srcs})
  # The room's headers alone, as coderq/<name>/: a link to its folder
  # under include/, in a folder of the build tree that holds nothing else,
  # so linking a room gives the headers of that room and no other.
  get_filename_component(hname ${folder} NAME)
  set(hroot ${PROJECT_BINARY_DIR}/rooms/${hname})
  file(MAKE_DIRECTORY ${hroot}/coderq)
  file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/coderq/${hname}
       ${hroot}/coderq/${hname} SYMBOLIC)
  target_include_directories(${name} PUBLIC ${hroot})
  target_link_libraries(${name} PUBLIC ${ARG_PUBLIC_LIBS}
                        PRIVATE ${rooms} ${ARG_LIBS})
  cq_target_warnings(${name})
  if(ARG_EXECUTABLE)
    add_executable(${ARG_EXECUTABLE} main.c)
    target_link_libraries(${ARG_EXECUTABLE} PRIVATE ${name} ${rooms} ${ARG_LIBS})
    cq_target_warnings(${ARG_EXECUTABLE})
  endif()
endfunction()

# cq_embed(target file symbol header): the text of \p file, beside the
# current CMakeLists.txt, built into \p target at build time as the
# NUL-terminated const char array \p symbol (cmake/Embed.cmake), which the
# private header \p header beside the sources declares. Code of another
# language (Python run in kernels, the report's script and stylesheet)
# lives in files of that language, linted by its own tools, and reaches
# the C that runs it only this way.
function(cq_embed target file symbol header)
  set(in ${CMAKE_CURRENT_SOURCE_DIR}/${file})
  set(out ${CMAKE_CURRENT_BINARY_DIR}/${symbol}.c)
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DIN=${in} -DOUT=${out} -DNAME=${symbol}
            -DHEADER=${header} -P ${PROJECT_SOURCE_DIR}/cmake/Embed.cmake
    DEPENDS ${in} ${PROJECT_SOURCE_DIR}/cmake/Embed.cmake
    VERBATIM)
  target_sources(${target} PRIVATE ${out})
  target_include_directories(${target} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
endfunction()
