# doc_block(OUT DOC LANG BODY): sets OUT to the text of the first ```LANG block of the markdown
# file DOC whose body matches the regex BODY (no backticks inside); a fatal error naming the page
# when there is none. The install tests build projects from the docs' code blocks as they stand.
function(doc_block out doc lang body)
  file(READ "${doc}" text)
  if(NOT text MATCHES "```${lang}\n(${body})```")
    message(FATAL_ERROR "${doc} has no ```${lang} block matching '${body}'")
  endif()
  set(${out} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()
