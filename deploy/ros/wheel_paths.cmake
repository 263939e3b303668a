# For a build against the ROS 2 wheels of the `ros` extra (build_interfaces.sh passes it as
# CMAKE_PROJECT_INCLUDE): the wheels' exported CMake targets name the Python include and NumPy
# directories of the machine that built them (/opt/python/cpXY-cpXY/...). Once the project is
# read, those paths are replaced by this Python's own, found by rosidl's FindPython3.
function(_thor_wheel_paths)
  get_property(_targets DIRECTORY PROPERTY IMPORTED_TARGETS)
  foreach(_t IN LISTS _targets)
    get_target_property(_inc ${_t} INTERFACE_INCLUDE_DIRECTORIES)
    if(_inc AND "${_inc}" MATCHES "/opt/python/cp")
      string(REGEX REPLACE "/opt/python/cp[0-9]+-cp[0-9]+/include/python[0-9.]+"
             "${Python3_INCLUDE_DIRS}" _inc "${_inc}")
      set(_numpy "lib/python[0-9.]+/site-packages/numpy/_core/include")
      string(REGEX REPLACE "/opt/python/cp[0-9]+-cp[0-9]+/${_numpy}"
             "${Python3_NumPy_INCLUDE_DIRS}" _inc "${_inc}")
      set_target_properties(${_t} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_inc}")
    endif()
  endforeach()
endfunction()
cmake_language(DEFER CALL _thor_wheel_paths)
