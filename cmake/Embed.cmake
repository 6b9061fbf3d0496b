# cmake -DIN=file -DOUT=file.c -DNAME=symbol [-DHEADER=h] -P Embed.cmake:
# the bytes of IN as a NUL-terminated const char array NAME in OUT, which
# includes HEADER (where NAME is declared; kserver_int.h when unset).
# ASCII only, so every value fits a char. Run at build time, so edits to
# IN rebuild. cq_embed() (cmake/Module.cmake) runs it for a room.
if(NOT DEFINED HEADER)
  set(HEADER kserver_int.h)
endif()
file(READ ${IN} hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
if(bytes MATCHES "0x[89a-f]")
  message(FATAL_ERROR "${IN} must be ASCII")
endif()
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE ${OUT} "/* generated from ${NAME}'s source by cmake/Embed.cmake */\n#include \"${HEADER}\"\n\nconst char ${NAME}[] = {\n${bytes}0x00};\n")
